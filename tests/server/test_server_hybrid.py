"""`vkrt serve` on a model with a recurrent state (qwen35moe): prompt-prefix reuse resumes from
the live state or from a checkpoint, and gives what a fresh prefill gives."""

from __future__ import annotations

import pytest
from models import tiny_model

from .serverproc import serving, wait_idle

FIRST = [{"role": "user", "content": "Hello, world! The capital of France is Paris. Once upon a time"}]


@pytest.fixture(scope="module")
def hybrid_server(tmp_path_factory):
    path = tiny_model("tiny-qwen35moe", tmp_path_factory.mktemp("hybrid-server"))
    yield from serving(path, "-c", "1024", "-np", "2", "-b", "256", "-ub", "64", "--ctx-checkpoints", "4")


def chat(srv, messages, cache=True, slot=None):
    body = {"messages": messages, "temperature": 0, "max_tokens": 8, "cache_prompt": cache}
    if slot is not None:
        body["id_slot"] = slot
    status, reply = srv.post("/v1/chat/completions", body)
    assert status == 200, reply
    wait_idle(srv)
    return reply["choices"][0]["message"]["content"], reply["usage"]["prompt_tokens_details"]["cached_tokens"], \
        reply["usage"]["prompt_tokens"]


def test_follow_up_turn_resumes_the_live_state(hybrid_server):
    answer, cached, _ = chat(hybrid_server, FIRST)
    assert cached == 0
    follow = FIRST + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
    resumed, cached, n_prompt = chat(hybrid_server, follow)
    fresh, cached_fresh, _ = chat(hybrid_server, follow, cache=False)
    assert 0 < cached < n_prompt and cached_fresh == 0
    assert resumed == fresh


def test_edited_last_message_resumes_from_a_checkpoint(hybrid_server):
    """The live state holds the first conversation through its answer; the new prompt diverges
    inside the last user turn, before the live state's end: only a checkpoint can serve it."""
    history = FIRST + [{"role": "assistant", "content": "Paris."}]
    chat(hybrid_server, history + [{"role": "user", "content": "what is the weather like today?"}])
    edited = history + [{"role": "user", "content": "def add(a, b): return a + b"}]
    resumed, cached, n_prompt = chat(hybrid_server, edited)
    fresh, _, _ = chat(hybrid_server, edited, cache=False)
    assert 0 < cached < n_prompt
    assert resumed == fresh
    slots = wait_idle(hybrid_server)
    assert all(s["n_checkpoints"] <= 4 for s in slots) and any(s["n_checkpoints"] > 0 for s in slots)


def test_concurrent_prompts_get_their_own_text(hybrid_server):
    """Two clients at once on the recurrent model (their prompts may be read in one step, in
    runs of one length): each gets the text it gets alone."""
    from .test_server_concurrency import _run

    prompts = ["Once upon a time there was a fox", "Once upon a time there was a dog"]
    wait_idle(hybrid_server)
    alone = _run(hybrid_server, prompts, 12, concurrent=False)
    together = _run(hybrid_server, prompts, 12, concurrent=True)
    assert together == alone and len(set(alone)) > 1
    wait_idle(hybrid_server)
