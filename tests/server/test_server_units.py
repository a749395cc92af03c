"""The server's pieces without a server: stop strings, incremental detokenization, chat
templates, request validation, slots' prefix choice, the Prometheus page."""

from __future__ import annotations

import re

import pytest

from vkrt.model.gguf_file import GGUFFile
from vkrt.model.tokenizer import Tokenizer
from vkrt.server.chat_template import CHATML, ChatTemplate, TemplateError
from vkrt.server.metrics import Metrics, parse
from vkrt.server.request_work import MAX_TOKENIZE_CHARS, RequestTokenizer
from vkrt.server.schemas import CHAT, LLAMA, Limits, parse_chat, parse_completion
from vkrt.server.slots import Slot, common_prefix
from vkrt.server.text import Detokenizer, StopMatcher
from vkrt.server.validation import BadRequest, get_token_ids, parse_json_object

LIMITS = Limits(n_ctx=512, vocab=300)


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    with GGUFFile(tiny_gguf) as f:
        return Tokenizer.from_metadata(f.metadata)


def feed(matcher: StopMatcher, pieces) -> str:
    return "".join(matcher.push(p) for p in pieces) + matcher.flush()


@pytest.mark.parametrize("pieces,stops,text,hit", [
    (["Hel", "lo wor", "ld"], ["wor"], "Hello ", "wor"),
    (["a", "b", "c", "d"], ["bc", "cd"], "a", "bc"),
    (["x<", "|im", "_e", "nd|>y"], ["<|im_end|>"], "x", "<|im_end|>"),
    (["ab", "ab", "c"], ["abc"], "ab", "abc"),
    (["Hello", " there"], ["thee"], "Hello there", None),
    (["no stops"], [], "no stops", None),
])
def test_stop_matcher(pieces, stops, text, hit):
    m = StopMatcher(stops)
    assert feed(m, pieces) == text and m.hit == hit


def test_stop_matcher_holds_back_only_what_may_start_a_stop():
    m = StopMatcher(["END"])
    assert m.push("The E") == "The "
    assert m.push("N") == ""
    assert m.push("D is near") == "" and m.hit == "END"


def test_detokenizer_pieces_add_up_to_the_whole(tokenizer):
    text = "Hello, world! The quick brown fox: 1 2 3.\n  def add(a, b):"
    ids = tokenizer.encode(text, add_special=False)
    d = Detokenizer(tokenizer)
    pieces = [d.push(t) for t in ids] + [d.flush()]
    assert "".join(pieces) == tokenizer.decode(ids, skip_special=True) == text
    assert sum(1 for p in pieces if p) > len(ids) // 2   # streamed, not all at the end


def test_detokenizer_skips_special_tokens(tokenizer):
    ids = tokenizer.encode("Hi<|im_end|> there", add_special=False)
    d = Detokenizer(tokenizer)
    assert "".join(d.push(t) for t in ids) + d.flush() == "Hi there"


def test_detokenizer_keeps_the_special_tokens_asked_for(tokenizer):
    """A reply parser's markup (llama-server's preserved tokens) stays in the text; other specials go."""
    ids = tokenizer.encode("a<|im_start|>b<|im_end|>c", add_special=False)
    d = Detokenizer(tokenizer, frozenset({tokenizer.tokens.index("<|im_start|>")}))
    assert "".join(d.push(t) for t in ids) + d.flush() == "a<|im_start|>bc"


def test_chat_template_chatml_and_helpers():
    t = ChatTemplate(None)
    assert t.source == CHATML
    assert t.render([{"role": "user", "content": "Hi"}]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    src = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}"
           "{% endif %}{% if loop.index > 2 %}{% break %}{% endif %}[{{ m.role }}]{{ m.content | trim }}\n"
           "{% endfor %}{{ strftime_now('%Y') }}|{{ tools | tojson }}|{{ {'a': [1, 2]} | tojson(indent=1) }}"
           "{% if enable_thinking is defined %}|think={{ enable_thinking }}{% endif %}")
    t = ChatTemplate(src, bos_token="<s>")
    out = t.render([{"role": "user", "content": " a "}, {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"}], tools=[{"type": "function"}],
                   extra={"enable_thinking": False, "messages": "ignored"})
    assert out.startswith("<s>[user]a\n[assistant]b\n") and "[user]c" not in out
    assert re.search(r"\n20\d\d\|", out) and '[{"type": "function"}]' in out and '"a": [\n  1' in out
    assert out.endswith("|think=False")
    with pytest.raises(TemplateError, match="no bad roles"):
        t.render([{"role": "bad", "content": "x"}])


def test_chat_template_is_sandboxed():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError):
        t.render([{"role": "user", "content": "x"}])



@pytest.mark.parametrize("source", ["{{ 'x' * 1000000000 }}", "{{ [0] * 10 ** 8 }}", "{% set n = 10 %}{{ n ** (n ** n) }}",
                                    "{{ {}.__init__ }}{{ 1 / 0 }}", "{% for i in range(10 ** 9) %}{% endfor %}"])
def test_chat_template_cannot_exhaust_the_server(source):
    """A model's template that would build a gigabyte, a billion-digit number, divide by zero or
    loop a billion times is a 400 on that request, at once."""
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])
    assert ChatTemplate("{{ 'ab' * 3 }}{{ 2 ** 10 }}{{ [1] * 2 }}").render([]) == "ababab1024[1, 1]"

def test_unparsable_template_falls_back_to_chatml(tokenizer):
    t = ChatTemplate.from_tokenizer({"tokenizer.chat_template": "{% for %}"}, tokenizer)
    assert t.source == CHATML


def test_parse_json_object_errors():
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_json_object(b"{")
    with pytest.raises(BadRequest, match="Infinity"):
        parse_json_object(b'{"a": Infinity}')
    assert parse_json_object(b'{"a": 1}') == {"a": 1}


def test_lone_surrogates_are_found_where_an_escape_may_hide_one():
    assert parse_json_object(b'{"a": ["\\ud83d\\ude00", 1]}') == {"a": ["\U0001f600", 1]}   # a pair is text
    with pytest.raises(BadRequest, match=r"'a\[1\]\.k' holds a lone UTF-16 surrogate") as exc:
        parse_json_object(b'{"a": [1, {"k": "x\\uDFFFy"}]}')
    assert exc.value.param == "a"
    with pytest.raises(BadRequest, match="lone UTF-16 surrogate"):
        parse_json_object(b'{"\\ud800": 1}')


def test_texts_past_the_tokenising_limit_are_refused_untokenised():
    class Counting:
        hf = calls = 0   # has `hf`: long texts go to a worker

        def encode(self, text, add_special):
            Counting.calls += 1
            return [1]

        def with_bos(self, ids, add_special):
            return ids
    tok = RequestTokenizer(Counting(), sandbox=None, loop=None)
    sent = []
    tok._in_sandbox = lambda task, args, attached, what: (sent.append(len(attached)), b"")
    with pytest.raises(BadRequest, match=f"'content' is {MAX_TOKENIZE_CHARS + 1} characters; vkrt tokenises at "
                                         f"most {MAX_TOKENIZE_CHARS}") as exc:
        tok.encode("x" * (MAX_TOKENIZE_CHARS + 1), field="content")
    assert exc.value.param == "content" and Counting.calls == 0 and sent == []
    assert tok.encode("short", field="content") == [1] and Counting.calls == 1
    # a prompt (no field) is bounded by its slot, not by this limit: tokenised in a worker
    assert tok.encode("y" * (MAX_TOKENIZE_CHARS + 1), add_special=False) == []
    assert sent == [MAX_TOKENIZE_CHARS + 1]


def test_token_ids_are_checked_by_count_then_type_then_range():
    assert get_token_ids([0, 5, 9], "p", 10) == [0, 5, 9]
    with pytest.raises(BadRequest, match="'p' holds 4 token ids; at most 3 fit a slot"):
        get_token_ids([1, "x", 2.5, True], "p", 10, most=3, why=" a slot")
    for bad in ([1, True], [1, 2.0], [1, "2"], [1, None]):
        with pytest.raises(BadRequest, match="must hold token ids"):
            get_token_ids(bad, "p", 10)
    with pytest.raises(BadRequest, match="token id -1, outside the vocabulary"):
        get_token_ids([3, -1, 10], "p", 10)
    with pytest.raises(BadRequest, match="an integer of 41 digits, outside"):
        get_token_ids([10 ** 40], "p", 10)


def test_parse_chat_fields():
    req = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}],
                      "max_completion_tokens": 7, "temperature": 0, "seed": -1, "stop": "x",
                      "stream": True, "stream_options": {"include_usage": True}}, LIMITS)
    assert req.api == CHAT and req.messages[0]["content"] == "ab" and req.max_tokens == 7
    assert req.params.greedy and req.params.seed is None and req.stop == ["x"] and req.include_usage


def test_parse_completion_forms():
    assert parse_completion({"prompt": ["hi"]}, LLAMA, LIMITS).prompt == "hi"
    assert parse_completion({"prompt": [[1, 2]]}, LLAMA, LIMITS).prompt == [1, 2]
    req = parse_completion({"prompt": [5, 6], "n_predict": -1}, LLAMA, LIMITS)
    assert req.prompt == [5, 6] and req.max_tokens is None
    with pytest.raises(BadRequest) as err:
        parse_completion({"prompt": "x", "top_p": float("nan")}, LLAMA, LIMITS)
    assert err.value.param == "top_p"


def test_slot_prefers_the_longest_cached_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([], [1]) == 0
    s = Slot(0, 64, Metrics())
    s.cache = [1, 2, 3, 4]
    assert s.reusable([1, 2, 3, 4]) == 3     # the last prompt token is evaluated again for its logits
    assert s.reusable([1, 2, 9]) == 2


def test_metrics_page_parses():
    m = Metrics()
    m.add_prompt(10, 0.5)
    m.add_decode(3, 0.25)
    page = m.render(processing=2, deferred=1, kv_tokens=64, kv_cells=256, slots=4)
    values = parse(page)
    assert values["vkrt_prompt_tokens_total"] == 10 and values["vkrt_n_decode_sequences_total"] == 3
    assert values["vkrt_requests_processing"] == 2 and values["vkrt_kv_cache_usage_ratio"] == 0.25
    # what routers scrape, under vLLM's names
    assert values["vllm:num_requests_running"] == 2 and values["vllm:num_requests_waiting"] == 1
    assert values["vllm:gpu_cache_usage_perc"] == 0.25 and values["vllm:gpu_prefix_cache_queries_total"] == 10
    for name in values:
        assert f"# TYPE {name} " in page and f"# HELP {name} " in page


class _Reader:
    """A prefilling slot of the fake scheduler: prefilling while its prompt is pending."""

    def __init__(self, id, pending, t_start, done):
        from types import SimpleNamespace
        self.id, self.pending, self.cache, self.t_start = id, list(range(pending)), [], t_start
        self.generating = False
        self.sampler = SimpleNamespace(takes_candidates=lambda n, adjusted: True, adjustments=lambda: None)
        self.job = SimpleNamespace(logprobs=None)
        self._done = done

    @property
    def prefilling(self):
        return bool(self.pending)

    def mask(self):
        return None

    def prefilled(self, top=None, logits=None):
        self._done.append(self.id)


def _recorded_steps(steps: list, one_size: bool = False):
    """A fake Engine.mixed that appends each step's [(slot, tokens)] to `steps` (one_size: the
    parts of a recurrent model's step must have one size) and returns empty candidates or rows."""
    import numpy as np

    def mixed(parts, adjust, top, masks=None):
        assert not one_size or len({len(t) for _, t in parts}) == 1, "a recurrent step's parts have one size"
        steps.append([(s, len(t)) for s, t in parts])
        n = len(parts)
        return (np.zeros((n, 4), np.float32), np.zeros((n, 4), np.int64)) if top else np.zeros((n, 10), np.float32)
    return mixed


def _prefill_steps(pendings: list[int], generating: bool, n_batch: int = 64, n_ubatch: int = 16):
    """The engine steps one _prefill of a recurrent model runs, [(slot, tokens)] each, and the
    slots whose prompt ended, in order: one prefilling slot per entry of `pendings` (oldest
    first) and, when `generating`, a generating one."""
    from types import SimpleNamespace

    from vkrt.server.checkpoints import SlotCheckpoints
    from vkrt.server.metrics import Metrics
    from vkrt.server.scheduler import Scheduler

    steps, done = [], []
    engine = SimpleNamespace(n_batch=n_batch, n_ubatch=n_ubatch, recurrent=True, candidate_rows=64,
                             mixed=_recorded_steps(steps, one_size=True))
    n = len(pendings) + 1
    sched = Scheduler(lambda: None, n, Metrics())
    sched.checkpoints = [SlotCheckpoints(i, 0) for i in range(n)]
    sched.slots = [_Reader(i, p, float(i), done) for i, p in enumerate(pendings)]
    sched.slots.append(SimpleNamespace(id=n - 1, prefilling=False, generating=generating, t_start=99.0))
    sched._prefill(engine)
    return steps, done


def test_prefill_gives_way_to_generating_slots():
    """A model with a recurrent state: with a slot generating, a step reads one micro-batch of
    another slot's long prompt (its next token waits one micro-batch, not the whole batch);
    alone, the prompt reads a batch."""
    assert _prefill_steps([100], generating=True) == ([[(0, 16)]], [])
    assert _prefill_steps([100], generating=False) == ([[(0, 16)]] * 4, [])


def test_prompts_arriving_together_share_a_step():
    """A recurrent model's prompts of one length are read in one step (one pass over the
    weights, not one a prompt); of different lengths, in runs of the length that reads most."""
    assert _prefill_steps([5, 5, 5], generating=True) == ([[(0, 5), (1, 5), (2, 5)]], [0, 1, 2])
    # 6, 7, 7 tokens: runs of 6 for all three, then the last token of the two longer prompts
    assert _prefill_steps([6, 7, 7], generating=False, n_ubatch=32) == \
        ([[(0, 6), (1, 6), (2, 6)], [(1, 1), (2, 1)]], [0, 1, 2])
    # the micro-batch caps a step: 4 slots of 4 tokens, then the fifth's
    assert _prefill_steps([4] * 5, generating=False) == ([[(k, 4) for k in range(4)], [(4, 4)]], [0, 1, 2, 3, 4])
    # the oldest slot always reads: a long prompt's micro-batch, the short ones at the next iteration
    assert _prefill_steps([40, 3, 3], generating=True) == ([[(0, 16)]], [])


def test_prompt_runs():
    from vkrt.server.scheduler import prompt_runs

    assert prompt_runs([105] + [106] * 15, 2048) == (16, 105)
    assert prompt_runs([106] * 15, 2048) == (15, 106)
    assert prompt_runs([106] * 15, 2048 - 16 * 105) == (3, 106)   # what the step's budget leaves
    assert prompt_runs([2048, 100, 100], 2048) == (1, 2048)   # the oldest reads a whole micro-batch
    assert prompt_runs([5, 100, 100], 2048) == (3, 5)          # the oldest is always among them
    assert prompt_runs([100] * 30, 2048) == (20, 100)
    assert prompt_runs([30, 10, 10, 10, 10], 64) == (5, 10)    # 50 tokens beat the oldest's 30 alone
    assert prompt_runs([30, 20, 20], 64) == (3, 20)
    assert prompt_runs([20, 10], 64) == (2, 10)               # a tie (2 x 10, 1 x 20): the shorter run, more slots
    assert prompt_runs([1], 1) == (1, 1)


def test_prompt_chunks_ride_with_decode_tokens_within_the_latency_budget():
    """One step holds every generating slot's token, the pending prompts that fit whole and a
    chunk of the oldest longer one; while slots generate the step keeps within max_itl_ratio
    decode steps (from the measured costs), alone, with no limit or with host experts it fills
    the micro-batch."""
    from types import SimpleNamespace

    from vkrt.server.metrics import Metrics
    from vkrt.server.scheduler import Scheduler

    steps = []
    engine = SimpleNamespace(n_ubatch=512, recurrent=False, candidate_rows=64, mixed=_recorded_steps(steps),
                             host_experts=False, stats=SimpleNamespace(record_seconds=0.0), padded_tokens=lambda n: n)
    sampler = SimpleNamespace(takes_candidates=lambda n, adjusted: True, adjustments=lambda: None)

    def run(ratio: float, generating: bool):
        sched = Scheduler(lambda: None, 2, Metrics(), max_itl_ratio=ratio)
        sched._decode_cost, sched._token_cost = 0.05, 0.0002   # a step of 250 tokens costs one decode step
        sampled = []
        reader = SimpleNamespace(id=0, generating=False, prefilling=True, pending=list(range(1000)), cache=[],
                                 t_start=0.0, sampler=sampler, job=SimpleNamespace(logprobs=None), mask=lambda: None)
        later = SimpleNamespace(id=2, generating=False, prefilling=True, pending=list(range(30)), cache=[],
                                t_start=5.0, sampler=sampler, job=SimpleNamespace(logprobs=None),
                                prefilled=lambda top: sampled.append(2), mask=lambda: None)
        other = SimpleNamespace(id=1, generating=generating, prefilling=False, next_token=7, t_start=1.0,
                                sampler=sampler, job=SimpleNamespace(logprobs=None), fed=lambda: None,
                                sample=lambda top: sampled.append(1), mask=lambda: None)
        sched.slots = [reader, other, later]
        steps.clear()
        sched._step(engine)
        return steps[-1], sampled, len(reader.cache)

    assert run(2.0, generating=True) == ([(1, 1), (2, 30), (0, 417)], [1, 2], 417)   # 500 tokens, down to 448
    assert run(0, generating=True) == ([(1, 1), (2, 30), (0, 481)], [1, 2], 481)
    assert run(2.0, generating=False) == ([(2, 30), (0, 482)], [2], 482)
    assert run(1.2, generating=True)[0] == [(1, 1), (2, 30), (0, 225)]
    assert run(1.1, generating=True)[0] == [(1, 1), (2, 30), (0, 225)]   # 275 tokens
    assert run(1.01, generating=True)[0] == [(1, 1), (2, 30), (0, 161)]
    # experts in host memory: a step carrying prompt streams them whatever its size, so it reads
    # a whole micro-batch
    engine.host_experts = True
    assert run(2.0, generating=True) == ([(1, 1), (2, 30), (0, 481)], [1, 2], 481)


def test_dry_breaker_tokens_and_the_sampler(tokenizer):
    """A breaker's tokens from the vocabulary (cached a breaker set); DRY moves greedy off the
    token that would repeat a sequence."""
    import numpy as np

    from vkrt.engine.dry import breaker_sequences
    from vkrt.engine.sampler import Sampler, SamplingParams
    seqs = breaker_sequences(tokenizer, ("\n",))
    nl = tokenizer.encode("\n", add_special=False)
    assert (nl[0], ()) in seqs and breaker_sequences(tokenizer, ("\n",)) is seqs   # cached
    p = SamplingParams(temperature=0, dry_multiplier=10.0, dry_allowed_length=2)
    s = Sampler(p)
    for t in [5, 6, 7, 5, 6]:
        s.accept(t)
    logits = np.zeros(20, np.float32)
    logits[7] = 1.0
    assert s.sample(logits) != 7 and not s.takes_candidates(64)


def test_warm_up_records_every_decode_batch_size(device, tiny_gguf):
    """After the warm-up, a decode step of any batch size the slots can make (candidates, of
    adjusted rows too, or whole rows) and a prompt of any length up to the micro-batch (padded),
    alone or with the other slots' decode tokens, replay recorded graphs: no request pays for
    recording one."""
    from vkrt.engine.engine import Engine
    from vkrt.engine.logit_adjust import logit_adjustments
    from vkrt.engine.sampler import SamplingParams
    from vkrt.model.loader import Model
    from vkrt.server.backend import Backend

    with Model(device, tiny_gguf, progress=False) as m, Engine(m, n_ctx=512, n_ubatch=128, n_seq_max=3) as e:
        backend = Backend(device, m, e)
        backend.warm_up(n_parallel=3)
        assert all(e.sequence_length(s) == 0 for s in range(3))
        recorded = e.stats.graphs_recorded
        penalty = logit_adjustments(SamplingParams(repeat_penalty=1.2), [5, 6, 7])
        for n in (1, 2, 3):
            pairs = [(s, 5) for s in range(n)]
            e.decode(pairs)
            e.decode_candidates(pairs)
            e.decode_candidates(pairs, [penalty] + [None] * (n - 1))
        e.reset()
        for n in (17, 64, 100, 128):
            e.mixed([(1, list(range(3, 3 + n)))], top=True)
            e.reset()
            e.mixed([(0, [5]), (1, list(range(3, 2 + n)))], top=True)
            e.reset()
            e.mixed([(0, [5]), (2, [6]), (1, list(range(3, 1 + n)))], top=True)
            e.reset()
        assert e.stats.graphs_recorded == recorded


def test_request_bodies_are_parsed_off_the_event_loop(monkeypatch):
    """read_body parses the JSON in a worker thread: a body of megabytes does not stall the loop
    (and every stream it serves) while it is parsed."""
    import asyncio
    import threading

    from vkrt.server import routes

    seen = {}

    def parse(raw):
        seen["thread"] = threading.get_ident()
        return parse_json_object(raw)

    from types import SimpleNamespace

    class Request:
        async def read(self):
            return b'{"prompt": "x"}'

    async def main():
        seen["loop"] = threading.get_ident()
        return await routes.read_body(Request(), SimpleNamespace(config=SimpleNamespace(timeout=5.0)))

    monkeypatch.setattr(routes, "parse_json_object", parse)
    assert asyncio.run(main()) == {"prompt": "x"}
    assert seen["thread"] != seen["loop"]


def test_a_grammar_dead_end_ends_its_request_with_a_400():
    """A grammar that allows no next token mid-generation is the request's fault: its job ends with
    a 400-coded failure and the slot is freed; another failure in sampling stays a 500."""
    from types import SimpleNamespace

    from vkrt.engine.grammar_limits import GrammarError
    from vkrt.server.jobs import Failed
    from vkrt.server.scheduler import Scheduler

    sched = Scheduler(lambda: None, 2, Metrics())
    sched.checkpoints = [SimpleNamespace(drop=lambda engine: None) for _ in range(2)]
    engine = SimpleNamespace(reset=lambda seq_id, from_pos=0: None)
    events = []
    for i, (exc, status) in enumerate(((GrammarError("the grammar allows no next token"), 400),
                                       (ValueError("a bug"), 500))):
        slot = Slot(i, 64, Metrics())
        slot.job = SimpleNamespace(emit=events.append)

        def step(logits, exc=exc):
            raise exc
        sched._guarded(engine, slot, step, None)
        assert slot.job is None and isinstance(events[-1], Failed) and events[-1].status == status
    assert "grammar" in events[0].message and events[0].type == "invalid_request_error"
    assert events[1].type == "server_error"


def _admissions(n_jobs: int, generating: bool, copy_seconds: float):
    """Which of n_jobs queued jobs one _admit gives a slot when each admission's prompt-cache copy
    takes copy_seconds, with or without a slot generating; and whether another thread could take
    the scheduler's lock during a copy (the event loop queueing a request)."""
    import threading
    import time
    from types import SimpleNamespace

    from vkrt.server.checkpoints import SlotCheckpoints
    from vkrt.server.metrics import Metrics
    from vkrt.server.scheduler import Scheduler

    n = n_jobs + 1
    sched = Scheduler(lambda: None, n, Metrics())
    lock_free = []

    class Slot(SimpleNamespace):
        def begin(self, job, tokenizer, keep, constraint):
            self.idle, self.job = False, job

    def admit(engine, job, idle, checkpoints):
        probe = threading.Thread(target=lambda: lock_free.append(sched._cond.acquire(timeout=1) and
                                                                 (sched._cond.release() or True)))
        probe.start()
        time.sleep(copy_seconds)
        probe.join()
        return idle[0], 0

    sched.slots = [Slot(id=i, idle=True, generating=False, last_used=0.0, job=None) for i in range(n_jobs)]
    sched.slots.append(Slot(id=n_jobs, idle=False, generating=generating, last_used=0.0, job=None))
    sched.checkpoints = [SlotCheckpoints(i, 0) for i in range(n)]
    sched.prompt_cache = SimpleNamespace(admit=admit)
    sched.tokenizer = SimpleNamespace(token_types=None)
    jobs = [SimpleNamespace(cancelled=False, id_slot=-1, prompt=[1, 2, 3], constraint=None, name=k)
            for k in range(n_jobs)]
    sched._admitting = list(jobs)
    sched._admit(SimpleNamespace(reset=lambda slot, keep: None))
    admitted = [s.job.name for s in sched.slots if s.job is not None]
    return admitted, [j.name for j in sched._queue], all(lock_free)


def test_admissions_give_way_to_generating_slots():
    """Requests arriving together while slots generate are admitted for at most ADMIT_SECONDS an
    iteration (each may copy a prefix to or from the prompt cache), the rest stay queued in order;
    with nothing generating, all at once. The lock stays free during the copies."""
    from vkrt.server.scheduler import ADMIT_SECONDS

    admitted, queued, free = _admissions(4, generating=True, copy_seconds=0.6 * ADMIT_SECONDS)
    assert (admitted, queued, free) == ([0, 1], [2, 3], True)
    admitted, queued, free = _admissions(4, generating=False, copy_seconds=0.6 * ADMIT_SECONDS)
    assert (admitted, queued, free) == ([0, 1, 2, 3], [], True)
