"""Sandbox workers (vkrt/server/sandbox.py): a template that loops, allocates gigabytes or writes
without end costs its worker and is a 400; a client that leaves frees its worker at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from vkrt.server.chat_template import CHATML
from vkrt.server.sandbox import Sandbox
from vkrt.server.validation import BadRequest

LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HOG = "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(5000) %}{% set ns.s = ns.s + ns.s[:1000000] %}{% endfor %}{{ ns.s|length }}"
FLOOD = "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"
MESSAGES = [{"role": "user", "content": "hi"}]


def render_args(source: str, max_bytes: int = 1 << 20) -> dict:
    return {"source": source, "bos": "", "eos": "", "messages": MESSAGES, "tools": None, "extra": {},
            "max_bytes": max_bytes, "too_long": "too long for a slot"}


def run(coro_fn, **sandbox):
    async def main():
        box = Sandbox(**sandbox)
        try:
            return await coro_fn(box), box.killed
        finally:
            await box.close()
    return asyncio.run(main())


def test_a_template_renders_in_a_worker_and_the_worker_is_reused():
    async def go(box):
        first = await box.call("render", render_args(CHATML), what="the chat template", field="messages")
        again = await box.call("render", render_args(CHATML), what="the chat template", field="messages")
        return first, again, len(box._all)
    (first, again, workers), killed = run(go)
    assert first == again == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert workers == 1 and killed == 0


@pytest.mark.parametrize("source,seconds,words", [
    (LOOP, 2.0, "took longer than 2 s"),
    (HOG, 30.0, "memory"),
    (FLOOD, 30.0, "too long for a slot"),
])
def test_a_misbehaving_template_is_a_400_and_the_next_render_works(source, seconds, words):
    async def go(box):
        t0 = time.monotonic()
        with pytest.raises(BadRequest) as err:
            await box.call("render", render_args(source), what="the chat template", field="messages")
        elapsed = time.monotonic() - t0
        ok = await box.call("render", render_args(CHATML), what="the chat template", field="messages")
        return err.value, elapsed, ok
    (err, elapsed, ok), killed = run(go, seconds=seconds, memory_bytes=256 << 20)
    assert words in err.message and err.param == "messages" and err.status == 400, err.message
    assert elapsed < seconds + 5 and ok.endswith("assistant\n")
    assert killed == (1 if source == LOOP else 0)


def test_a_cancelled_call_kills_its_worker():
    async def go(box):
        task = asyncio.ensure_future(box.call("render", render_args(LOOP), what="the chat template", field="m"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return box.busy
    busy, killed = run(go, seconds=60.0)
    assert busy == 0 and killed == 1


def test_a_grammar_refusal_names_its_field():
    async def go(box):
        with pytest.raises(BadRequest) as err:
            await box.call("grammar", {"kind": "json_schema", "source": {"type": "strin"}, "field": "json_schema"},
                           what="'json_schema'", field="json_schema")
        ok = await box.call("grammar", {"kind": "gbnf", "source": 'root ::= "a"', "field": "grammar"},
                            what="'grammar'", field="grammar")
        return err.value, ok
    (err, ok), _ = run(go)
    assert err.param == "json_schema" and "llguidance" in err.message and "<state>" not in err.message
    assert isinstance(ok, str) and ok


def test_large_texts_tokenise_in_a_worker_exactly_as_here(tmp_path):
    """RequestTokenizer sends a text past SANDBOX_CHARS (and ids past SANDBOX_IDS) to a worker: the
    same ids and text as the tokenizer itself gives, BOS included."""
    from models import tiny_model

    from vkrt.model.gguf_file import GGUFFile
    from vkrt.model.tokenizer import Tokenizer
    from vkrt.server.request_work import SANDBOX_CHARS, SANDBOX_IDS, RequestTokenizer, in_thread
    tok = Tokenizer.from_metadata(GGUFFile(tiny_model("tiny-qwen3", tmp_path)).metadata, None)
    text = ("def f(x):\n    return x * 2  # ünïcode ✓\n" * (SANDBOX_CHARS // 40 + 10))
    assert len(text) > SANDBOX_CHARS

    async def go(box):
        rt = RequestTokenizer(tok, box, asyncio.get_running_loop())
        ids = await in_thread(rt.encode, text, True)
        back = await in_thread(rt.decode, ids[:SANDBOX_IDS + 5])
        return ids, back, len(box._all)
    (ids, back, workers), _ = run(go)
    assert workers == 1 and len(ids) > SANDBOX_IDS
    assert ids == tok.encode(text, True)
    assert back == tok.decode(ids[:SANDBOX_IDS + 5])


def _body_reader(box):
    from types import SimpleNamespace

    from vkrt.server import routes

    async def read(raw: bytes):
        class Request:
            async def read(self):
                return raw
        return await routes.read_body(Request(), SimpleNamespace(config=SimpleNamespace(timeout=30.0), sandbox=box))
    return read


def test_large_bodies_parse_in_a_worker_exactly_as_here():
    """A body past WORKER_BYTES is parsed in a worker and comes back equal to json.loads' value:
    long int and float lists packed (bools, mixed lists, ints past int64 and short lists not), at
    any depth; its refusals read as a small body's."""
    import json

    from vkrt.server.body_parse import MAX_VALUES, WORKER_BYTES
    from vkrt.server.validation import parse_json_object
    body = {"tokens": list(range(-5, 120_000)), "floats": [0.1 * i for i in range(300)],
            "flags": [True, False] * 100, "mixed": [1, 2.5] * 100, "huge": [2 ** 70] * 100, "short": [1, 2, 3],
            "messages": [{"role": "user", "content": "héllo ✓", "ids": [[7] * 80, list(range(90))]}] * 3,
            "empty": [], "nested": {"deep": [{"x": list(range(64))}]}}
    raw = json.dumps(body).encode()
    assert len(raw) > WORKER_BYTES
    bad = [b"{" + b" " * WORKER_BYTES + b'"a": NaN}', b"[" + b"1," * WORKER_BYTES + b"1]",
           b'{"a": "' + b"x" * WORKER_BYTES + b"\\ud800\"}",
           json.dumps({"m": [{"r": 1}] * (MAX_VALUES // 2 + 1)}).encode()]

    async def go(box):
        read = _body_reader(box)
        got = await read(raw)
        errors = []
        for b in bad:
            with pytest.raises(BadRequest) as err:
                await read(b)
            errors.append(err.value.message)
        return got, errors, await read(raw)
    (got, errors, again), killed = run(go)
    assert got == body == again and killed == 0
    assert [type(v) for v in got["tokens"][:3]] == [int] * 3 and got["flags"][0] is True
    for b, message in zip(bad[:3], errors):
        with pytest.raises(BadRequest) as here:
            parse_json_object(b)
        assert message == here.value.message
    assert f"more than {MAX_VALUES} JSON values" in errors[3]


def test_packing_leaves_json_for_what_does_not_pack():
    from vkrt.server.body_parse import PACK_MIN, parse_packed, unpack
    raw = b'{"a": [' + b"1," * PACK_MIN + b'2], "b": [1.5, 2], "c": [[' + b"0.5," * PACK_MIN + b'1e300]]}'
    info, data = parse_packed(raw)
    assert info["body"] == {"a": None, "b": [1.5, 2], "c": [None]}
    assert info["packed"] == [[["a"], "q", PACK_MIN + 1], [["c", 0], "d", PACK_MIN + 1]]
    assert len(data) == 16 * (PACK_MIN + 1)
    import json
    assert unpack(json.loads(json.dumps(info)), data) == json.loads(raw)
