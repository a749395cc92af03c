"""`vkrt serve --spec-type ngram`: slots speculate in the same verification step, and every
client gets the tokens a server without speculation gives (greedy, one client and several at
once), on a model with a KV cache only and on one with a recurrent state; timings and /slots
report it; a slot with a grammar or penalties still decodes one token a step."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from contextlib import contextmanager

import pytest
from models import TINY, tiny_model

from .serverproc import metric, serving, wait_idle

served = contextmanager(serving)

PROMPTS = [list(range(5, 30)) * 3 + list(range(5, 9)), list(range(40, 52)) * 5 + [40, 41],
           [7, 8, 9] * 10, list(range(60, 90))]
ARGS = ("-c", "1024", "-np", "4", "-b", "128", "-ub", "64")


def _complete(srv, prompt, **extra):
    status, reply = srv.post("/completion", {"prompt": prompt, "n_predict": 24, "temperature": 0,
                                             "cache_prompt": False, "return_tokens": True, **extra})
    assert status == 200, reply
    return reply


def _all(srv, together: bool):
    if not together:
        return [_complete(srv, p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda p: _complete(srv, p), PROMPTS))


@pytest.mark.parametrize("name,how", [("tiny-qwen3", "ngram"), ("tiny-qwen35moe", "draft")])
def test_speculating_server_gives_the_same_tokens(tmp_path_factory, name, how):
    """n-gram lookup on a model without a recurrent state; on qwen35moe (whose random weights do
    not repeat themselves) the model drafting for itself (-md the same file)."""
    path = tiny_model(name, tmp_path_factory.mktemp("spec-server"))
    plain = None
    with served(path, *ARGS) as srv:
        plain = [r["tokens"] for r in _all(srv, together=False)]
    spec = ("--spec-type", "ngram") if how == "ngram" else ("-md", path, "--draft-p-min", "0")
    with served(path, *ARGS, *spec, "--draft-max", "6") as srv:
        alone = _all(srv, together=False)
        assert [r["tokens"] for r in alone] == plain
        assert sum(r["timings"].get("draft_n", 0) for r in alone) > 0
        accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in alone)
        assert accepted > 0
        wait_idle(srv)
        drafted0 = metric(srv, "vkrt_draft_tokens_total")
        together = _all(srv, together=True)
        assert [r["tokens"] for r in together] == plain
        assert metric(srv, "vkrt_draft_tokens_total") > drafted0
        slots = wait_idle(srv)
        assert all(s["speculative"] for s in slots)
        assert "drafts accepted)" in srv.log   # the request's log line counts them
        # penalties and grammars take no drafts: one token a step, and still what they ask for
        reply = _complete(srv, PROMPTS[2], repeat_penalty=1.5)
        assert "draft_n" not in reply["timings"]
        reply = _complete(srv, PROMPTS[0], grammar='root ::= "ab" [a-z]*')
        assert reply["content"].startswith("ab") and "draft_n" not in reply["timings"]
        # llama-server's per-request fields: n_max 0 turns drafting off, 2 caps it; bad values are 400s
        i = max(range(len(PROMPTS)), key=lambda j: alone[j]["timings"].get("draft_n", 0))   # one that drafts
        off = _complete(srv, PROMPTS[i], **{"speculative.n_max": 0})
        assert off["tokens"] == plain[i] and "draft_n" not in off["timings"]
        capped = _complete(srv, PROMPTS[i], **{"speculative.n_max": 2, "speculative.p_min": 0.0})
        assert capped["tokens"] == plain[i] and capped["timings"]["draft_n"] > 0
        status, err = srv.post("/completion", {"prompt": PROMPTS[0], "speculative.n_max": -1})
        assert status == 400 and "speculative.n_max" in err["error"]["message"]
    with served(path, *ARGS) as srv:   # a server that does not speculate says so
        status, err = srv.post("/completion", {"prompt": PROMPTS[0], "speculative.n_max": 4})
        assert status == 400 and "without speculative decoding" in err["error"]["message"]


@pytest.mark.parametrize("name,block,extra", [("tiny-qwen35moe", 4, {}),
                                               ("tiny-glm4moe", 3, dict(nextn_own_head=True))])
def test_speculating_server_with_mtp_gives_the_same_tokens(tmp_path_factory, name, block, extra):
    """--spec-type mtp with 2 slots (tiny qwen35moe, and tiny glm4moe with its own NextN
    embedding and head, each with an MTP block): every client gets the tokens of a server without
    speculation, alone and both at once (the slots' drafts made in shared steps of the head)."""
    from vkrt.model.synthetic import write_model
    path = write_model(tmp_path_factory.mktemp("spec-mtp") / "mtp.gguf",
                       dataclasses.replace(TINY[name], n_nextn=1, **extra))
    prompts, args = PROMPTS[:2], ("-c", "512", "-np", "2", "-b", "64", "-ub", "64")
    with served(path, *args) as srv:
        plain = [_complete(srv, p)["tokens"] for p in prompts]
    with served(path, *args, "--spec-type", "mtp", "--draft-p-min", "0", "--draft-max", "4") as srv:
        alone = [_complete(srv, p) for p in prompts]
        assert [r["tokens"] for r in alone] == plain
        assert all(r["timings"]["draft_n"] > 0 for r in alone)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda p: _complete(srv, p), prompts))
        assert [r["tokens"] for r in together] == plain
        assert f"the model's MTP head (blk.{block})" in srv.log


def test_spec_options_are_checked(tmp_path_factory, caplog):
    from click.testing import CliRunner

    from vkrt.cli.main import cli
    path = tiny_model("tiny-qwen3", tmp_path_factory.mktemp("spec-cli"))
    for args, msg in ((["--spec-type", "draft"], "needs a draft model"),
                      (["--spec-type", "ngram", "-md", path], "for a draft model"),
                      (["-md", "/nonexistent.gguf"], "no such file"),
                      (["--spec-type", "ngram", "--draft-max", "0"], "draft-max")):
        result = CliRunner().invoke(cli, ["serve", "-m", path, *args])
        assert result.exit_code == 2 and msg in result.output, (args, result.output)
    # a model without an MTP block: the load fails, saying why
    result = CliRunner().invoke(cli, ["serve", "-m", path, "--spec-type", "mtp"])
    assert result.exit_code == 1 and "MTP drafting runs the MTP blocks of" in caplog.text
