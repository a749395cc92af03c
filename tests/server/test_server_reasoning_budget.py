"""The reasoning budget (vkrt/server/reasoning_budget.py): the count on its own, then a tiny model
behind a template that opens <think>: with a budget of N the reply thinks N tokens, then the forced
"\\n</think>" (after --reasoning-budget-message's text, or a request's reasoning_budget_message)
closes the block and the answer follows; 0 closes it at once (and renders the template with
enable_thinking false); -1 leaves it open. Bad values are a 400 naming the field."""

from __future__ import annotations

import dataclasses

import openai
import pytest

from models import TINY
from vkrt.model.synthetic import write_model
from vkrt.server.reasoning_budget import FORCED_CLOSE, BudgetSpec, ThinkingBudget

from .serverproc import API_KEY, serving

THINKING = """{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""
ASK = [{"role": "user", "content": "Think about it."}]
FORCED = (7, 8)


def run(budget: ThinkingBudget, pieces: list[str]) -> list[int | None]:
    """The forced token at each step, the sampled token being 0 with its piece of text."""
    out = []
    for text in pieces:
        token = budget.next_forced()
        out.append(token)
        budget.accept(token if token is not None else 0, text if token is None else "", whole=True)
    return out


def test_counts_inside_a_block_then_forces_its_close():
    assert run(ThinkingBudget(BudgetSpec(2, FORCED, open=True)), ["a", "b", "", "", "c"]) == [None, None, 7, 8, None]
    assert run(ThinkingBudget(BudgetSpec(0, FORCED, open=True)), ["", "", "x"]) == [7, 8, None]
    # a block the reply opens is counted from its tag; one the model closes itself is left alone
    assert run(ThinkingBudget(BudgetSpec(1, FORCED, open=False)), ["hi <th", "ink>", "x", "", "", "y"]) == [
        None, None, None, 7, 8, None]
    assert run(ThinkingBudget(BudgetSpec(3, FORCED, open=True)), ["a", "</think>", "b", "c", "d"]) == [None] * 5


def test_waits_for_a_whole_character_and_yields_to_a_grammar():
    b = ThinkingBudget(BudgetSpec(1, FORCED, open=True))
    b.accept(0, "", whole=False)   # half a UTF-8 character
    assert b.next_forced() is None
    b.accept(0, "é", whole=True)
    assert b.next_forced(allowed=lambda t: False) is None and b.next_forced() is None   # gave up for good


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("budget") / "tiny-thinking.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen3"], chat_template=THINKING))
    return path


@pytest.fixture(scope="module")
def srv(model_path):
    yield from serving(model_path, "-c", "1024", "-np", "2", "-b", "256", "-ub", "256")


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def pieces(srv, text: str) -> list[bytes]:
    status, out = srv.post("/tokenize", {"content": text, "with_pieces": True})
    assert status == 200
    return [p["piece"].encode() for p in out["tokens"]]


def reply(client, n: int, **extra) -> tuple[list[bytes], object]:
    """The reply's token pieces (bytes) and message, greedy, ignoring EOS, n tokens."""
    out = client.chat.completions.create(model="m", messages=ASK, max_tokens=n, temperature=0, logprobs=True,
                                         extra_body={"ignore_eos": True, **extra})
    choice = out.choices[0]
    return [bytes(t.bytes) for t in choice.logprobs.content], choice.message


def at(tokens: list[bytes], seq: list[bytes]) -> int | None:
    return next((i for i in range(len(tokens)) if tokens[i:i + len(seq)] == seq), None)


@pytest.mark.parametrize("field", ["reasoning_budget_tokens", "thinking_budget_tokens"])
def test_budget_n_closes_the_block_after_n_tokens(client, srv, field):
    close = pieces(srv, FORCED_CLOSE)
    tokens, msg = reply(client, 20, **{field: 5})
    assert at(tokens, close) == 5, tokens   # 5 thinking tokens, then the forced close
    assert msg.reasoning_content and msg.content, msg   # the answer goes on after it
    free, msg = reply(client, 20)
    assert at(free, close) is None and free[:5] == tokens[:5] and not msg.content   # -1: the same thoughts, open


def test_budget_zero(client, srv):
    close = pieces(srv, FORCED_CLOSE)
    status, out = srv.post("/apply-template", {"messages": ASK, "reasoning_budget_tokens": 0})
    assert status == 200 and out["prompt"].endswith("<think>\n\n</think>\n\n")   # thinking off in the template
    # a template told to think anyway: the block is closed at once
    tokens, msg = reply(client, 12, reasoning_budget_tokens=0, chat_template_kwargs={"enable_thinking": True})
    assert at(tokens, close) == 0 and not getattr(msg, "reasoning_content", None) and msg.content, (tokens, msg)


def test_streamed_reply_holds_the_same_split(client):
    body = dict(model="m", messages=ASK, max_tokens=16, temperature=0, extra_body={
        "ignore_eos": True, "reasoning_budget_tokens": 4})
    whole = client.chat.completions.create(**body).choices[0].message
    reasoning = content = ""
    for chunk in client.chat.completions.create(**body, stream=True):
        for ch in chunk.choices:
            reasoning += getattr(ch.delta, "reasoning_content", None) or ""
            content += ch.delta.content or ""
    assert (reasoning, content) == (whole.reasoning_content, whole.content) and content


@pytest.mark.parametrize("value", [-2, "5", 1.5, True])
def test_bad_budgets_are_refused(client, value):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, extra_body={"reasoning_budget_tokens": value})
    assert err.value.body["param"] == "reasoning_budget_tokens", err.value.body


MESSAGE = " ... I have to give the answer now."


@pytest.fixture(scope="module")
def msg_srv(model_path):
    yield from serving(model_path, "-c", "1024", "-np", "1", "-b", "256", "-ub", "256",
                       "--reasoning-budget-message", MESSAGE)


def test_budget_message_flag_goes_before_the_close(msg_srv):
    client = openai.OpenAI(base_url=msg_srv.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    forced = pieces(msg_srv, MESSAGE + FORCED_CLOSE)
    tokens, msg = reply(client, len(forced) + 12, reasoning_budget_tokens=5)
    assert tokens[5:5 + len(forced)] == forced, tokens   # 5 thinking tokens, the message, the close
    assert msg.reasoning_content.rstrip().endswith(MESSAGE.strip()) and msg.content, msg
    assert MESSAGE.strip() not in msg.content
    # a request's reasoning_budget_message overrides the flag ("" : the close alone)
    for text in ("Enough.", ""):
        forced = pieces(msg_srv, text + FORCED_CLOSE)
        tokens, msg = reply(client, len(forced) + 12, reasoning_budget_tokens=5, reasoning_budget_message=text)
        assert tokens[5:5 + len(forced)] == forced and MESSAGE.strip() not in msg.reasoning_content, (text, tokens)


def test_budget_message_per_request(client, srv):
    forced = pieces(srv, "Time to answer." + FORCED_CLOSE)
    tokens, msg = reply(client, len(forced) + 12, reasoning_budget_tokens=3, reasoning_budget_message="Time to answer.")
    assert tokens[3:3 + len(forced)] == forced and msg.reasoning_content.rstrip().endswith("Time to answer.")
    tokens, _ = reply(client, 30, reasoning_budget_tokens=3)   # no flag: the close alone
    assert tokens[3:3 + len(pieces(srv, FORCED_CLOSE))] == pieces(srv, FORCED_CLOSE)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=ASK, extra_body={"reasoning_budget_message": 5})
    assert err.value.body["param"] == "reasoning_budget_message", err.value.body
