"""/v1/embeddings and /embedding against the engine's own hidden states (pooled and normalised
in numpy here), their shapes, errors and the --embeddings / --pooling switches; /apply-template,
GET /v1/models/{id}; /infill's token layout on a model whose GGUF names FIM tokens."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import json
from types import SimpleNamespace

import gguf
import numpy as np
import openai
import pytest
from click.testing import CliRunner
from models import TINY

from vkrt.cli.main import cli
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model
from vkrt.model.synthetic import write_model
from vkrt.server.embeddings import check_enabled
from vkrt.server.infill import FimTokens, infill_tokens
from vkrt.server.validation import ApiError

from .conftest import SERVER_ARGS
from .serverproc import API_KEY, serving

TEXTS = ["The quick brown fox", "jumps over the lazy dog", "Hello"]
U32 = gguf.GGUFValueType.UINT32
FIM = (100, 101, 102)   # the FIM prefix / suffix / middle token ids the FIM model's metadata names


@pytest.fixture(scope="module")
def mean_server(tiny_gguf):
    yield from serving(tiny_gguf, *SERVER_ARGS, "--embeddings", "--pooling", "mean")


@pytest.fixture(scope="module")
def fim_gguf(tmp_path_factory) -> str:
    """tiny-qwen3 with FIM tokens and pooling_type 3 (last) in its metadata."""
    spec = TINY["tiny-qwen3"]
    extra = {"tokenizer.ggml.fim_pre_token_id": (FIM[0], U32), "tokenizer.ggml.suffix_token_id": (FIM[1], U32),
             "tokenizer.ggml.fim_mid_token_id": (FIM[2], U32), "qwen3.pooling_type": (3, U32)}
    path = tmp_path_factory.mktemp("fim") / "tiny-fim.gguf"
    return write_model(path, type(spec)(**{**spec.__dict__, "extra": extra}))


@pytest.fixture(scope="module")
def fim_server(fim_gguf):
    yield from serving(fim_gguf, *SERVER_ARGS, "--embeddings")


@pytest.fixture(scope="module")
def reference(device, tiny_gguf):
    """hidden(text or tokens) -> the engine's per-token final states, and the tokenizer."""
    with Model(device, tiny_gguf, progress=False) as m, Engine(m, n_ctx=256, n_ubatch=64) as e:
        def hidden(prompt):
            e.reset()
            ids = m.tokenizer.encode(prompt, add_special=True) if isinstance(prompt, str) else prompt
            return e.hidden_states(ids).astype(np.float64)
        yield hidden, m.tokenizer


def unit(v):
    return v / np.linalg.norm(v)


def test_mean_pooling_equals_the_engine_states(mean_server, reference):
    hidden, tok = reference
    status, out = mean_server.post("/v1/embeddings", {"input": TEXTS, "model": "m"})
    assert status == 200, out
    assert out["object"] == "list" and out["model"] == "m"
    assert [d["index"] for d in out["data"]] == [0, 1, 2] and all(d["object"] == "embedding" for d in out["data"])
    n = sum(len(tok.encode(t, add_special=True)) for t in TEXTS)
    assert out["usage"] == {"prompt_tokens": n, "total_tokens": n}
    for text, d in zip(TEXTS, out["data"]):   # in input order: each its own text's vector
        got = np.array(d["embedding"])
        np.testing.assert_allclose(got, unit(hidden(text).mean(axis=0)), atol=2e-4)
        assert abs(np.linalg.norm(got) - 1) < 1e-5
    # llama-server's /embedding: the same vectors, each wrapped in a list; embd_normalize -1: raw
    status, raw = mean_server.post("/embedding", {"content": TEXTS[0], "embd_normalize": -1})
    assert status == 200 and [r["index"] for r in raw] == [0] and len(raw[0]["embedding"]) == 1
    np.testing.assert_allclose(raw[0]["embedding"][0], hidden(TEXTS[0]).mean(axis=0), atol=2e-4)
    status, p1 = mean_server.post("/embedding", {"input": TEXTS[:2], "embd_normalize": 1})
    v = hidden(TEXTS[1]).mean(axis=0)
    np.testing.assert_allclose(p1[1]["embedding"][0], v / np.abs(v).sum(), atol=2e-5)


def test_token_arrays_and_base64(mean_server, reference):
    hidden, tok = reference
    ids = tok.encode(TEXTS[1], add_special=True)
    status, by_ids = mean_server.post("/v1/embeddings", {"input": ids, "encoding_format": "base64"})
    assert status == 200, by_ids
    got = np.frombuffer(base64.b64decode(by_ids["data"][0]["embedding"]), "<f4")
    status, by_text = mean_server.post("/v1/embeddings", {"input": [TEXTS[1], [5, 6, 7]]})
    np.testing.assert_array_equal(got, np.array(by_text["data"][0]["embedding"], np.float32))
    np.testing.assert_allclose(by_text["data"][1]["embedding"], unit(hidden([5, 6, 7]).mean(axis=0)), atol=2e-4)
    assert by_text["usage"]["prompt_tokens"] == len(ids) + 3


def test_openai_client(mean_server, reference):
    hidden, _ = reference
    client = openai.OpenAI(base_url=mean_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    out = client.embeddings.create(model="tiny", input=TEXTS[:2])   # the client asks for base64 and decodes it
    assert [d.index for d in out.data] == [0, 1] and out.usage.prompt_tokens > 0
    np.testing.assert_allclose(out.data[1].embedding, unit(hidden(TEXTS[1]).mean(axis=0)), atol=2e-4)
    floats = client.embeddings.create(model="tiny", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, unit(hidden(TEXTS[0]).mean(axis=0)), atol=2e-4)


@pytest.mark.parametrize("body, words, param", [
    ({"input": "x", "dimensions": 32}, "embedding size 64", "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "'float' or 'base64'", "encoding_format"),
    ({"input": []}, "non-empty", "input"),
    ({"input": ["ok", ""]}, "'input[1]' is empty", "input[1]"),
    ({"input": ["ok", 5]}, "string or an array of token ids", "input[1]"),
    ({"input": [1, 10 ** 9]}, "outside the vocabulary", "input"),
    ({"input": ["ok", "word " * 300]}, "'input[1]' is", "input[1]"),
    ({"model": "x"}, "'input' or 'content'", "input"),
])
def test_bad_requests(mean_server, body, words, param):
    status, out = mean_server.post("/v1/embeddings", body)
    assert status == 400, out
    assert words in out["error"]["message"] and out["error"].get("param") == param
    assert mean_server.post("/v1/embeddings", {"input": "ok", "dimensions": 64})[0] == 200


def test_embeddings_need_the_flag(server):
    for path in ("/v1/embeddings", "/embedding", "/embeddings"):
        status, out = server.post(path, {"input": "x"})
        assert status == 501 and "--embeddings" in out["error"]["message"]


def test_gguf_pooling_last_and_generation_beside_it(fim_server, device, fim_gguf):
    want = []
    with Model(device, fim_gguf, progress=False) as m, Engine(m, n_ctx=256, n_ubatch=64) as e:
        for text in TEXTS[:2]:
            e.reset()
            want.append(unit(e.hidden_states(m.tokenizer.encode(text, True))[-1].astype(np.float64)))
    status, out = fim_server.post("/v1/embeddings", {"input": TEXTS[:2]})
    assert status == 200, out
    for d, w in zip(out["data"], want):
        np.testing.assert_allclose(d["embedding"], w, atol=2e-4)
    # a generating slot keeps its cache and text while embeddings run on the other slots
    body = {"prompt": TEXTS[0], "n_predict": 12, "temperature": 0, "cache_prompt": False}
    alone = fim_server.post("/completion", body)[1]["content"]
    with cf.ThreadPoolExecutor(4) as pool:
        gen = pool.submit(fim_server.post, "/completion", body)
        embs = [pool.submit(fim_server.post, "/v1/embeddings", {"input": TEXTS}) for _ in range(3)]
        assert gen.result()[1]["content"] == alone
        assert all(f.result()[0] == 200 for f in embs)


def test_pooling_none(tiny_gguf, reference):
    hidden, _ = reference
    for srv in serving(tiny_gguf, *SERVER_ARGS, "--embedding", "--pooling", "none"):
        status, out = srv.post("/v1/embeddings", {"input": "x"})
        assert status == 400 and "Pooling type 'none' is not OAI compatible" in out["error"]["message"]
        status, out = srv.post("/embedding", {"content": TEXTS[0]})
        assert status == 200
        rows = np.array(out[0]["embedding"])   # every token's state, not normalised
        np.testing.assert_allclose(rows, hidden(TEXTS[0]), atol=2e-4)


def test_cls_pooling(tiny_gguf, reference):
    hidden, _ = reference
    for srv in serving(tiny_gguf, *SERVER_ARGS, "--embeddings", "--pooling", "cls"):
        status, out = srv.post("/v1/embeddings", {"input": TEXTS})
        assert status == 200
        for text, d in zip(TEXTS, out["data"]):
            np.testing.assert_allclose(d["embedding"], unit(hidden(text)[0]), atol=2e-4)


def test_apply_template_is_the_chat_prompt(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, world!"}]
    status, out = server.post("/apply-template", {"messages": messages})
    assert status == 200 and "Hello, world!" in out["prompt"] and "Be brief." in out["prompt"]
    n = len(server.post("/tokenize", {"content": out["prompt"], "add_special": True})[1]["tokens"])
    status, chat = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 4, "temperature": 0})
    assert chat["usage"]["prompt_tokens"] == n
    status, comp = server.post("/completion", {"prompt": out["prompt"], "n_predict": 4, "temperature": 0})
    assert comp["content"] == chat["choices"][0]["message"]["content"]
    assert server.post("/apply-template", {"messages": []})[0] == 400


def test_model_by_id(server):
    status, raw = server.get("/v1/models")
    model = json.loads(raw)["data"][0]
    status, raw = server.get("/v1/models/" + model["id"])
    assert status == 200 and json.loads(raw) == model
    status, raw = server.get("/v1/models/no-such-model")
    err = json.loads(raw)["error"]
    assert status == 404 and "no-such-model" in err["message"] and err["param"] == "model"


def test_infill_layout():
    enc = lambda text: [ord(c) for c in text]   # noqa: E731
    fim = FimTokens(pre=1, suf=2, mid=3, rep=4, sep=5)
    prefix, suffix, extra = list(range(100, 120)), list(range(200, 220)), [{"filename": "a.py", "text": "xy"}]
    # n_batch 16: the prefix keeps its last 12 tokens, the suffix 16 / 4 - (2 + 1 prompt token) = 1
    head = [9, 1] + prefix[8:] + [50, 2, 200, 3]
    repo = [4] + enc("myproject\n") + [5] + enc("a.py\n") + enc("xy") + [5] + enc("filename\n")
    assert infill_tokens(fim, enc, prefix, suffix, extra, [50], 16, 64, bos=9) == repo + head
    # the extra context keeps its end: n_ctx - n_batch + 2 (n_predict -1) tokens
    assert infill_tokens(fim, enc, prefix, suffix, extra, [50], 16, 16, bos=9) == enc("e\n") + head
    plain = FimTokens(pre=1, suf=2, mid=3, rep=None, sep=None)
    assert infill_tokens(plain, enc, [7], [8], extra, [], 16, 64, bos=None) == \
        enc("\n\n--- snippet ---\n\n") + enc("xy") + [1, 7, 2, 8, 3]


def test_infill_tokenises_only_the_extra_context_it_keeps():
    calls = []

    def enc(text):
        calls.append(text)
        return [ord(c) for c in text]
    fim = FimTokens(pre=1, suf=2, mid=3, rep=4, sep=5)
    extra = [{"filename": f"f{i}.py", "text": f"chunk {i} " * 4} for i in range(1000)]
    every = [4] + [ord(c) for c in "myproject\n"]
    for chunk in extra:
        every += [5] + [ord(c) for c in chunk["filename"] + "\n"] + [ord(c) for c in chunk["text"]]
    every += [5] + [ord(c) for c in "filename\n"]
    # n_ctx 64, n_batch 16, n_predict -1: the last 50 tokens of the extra context
    assert infill_tokens(fim, enc, [7], [8], extra, [], 16, 64, bos=None) == every[-50:] + [1, 7, 2, 8, 3]
    assert len(calls) <= 4


def test_infill(fim_server, device, fim_gguf):
    with Model(device, fim_gguf, progress=False) as m:
        enc = lambda text: m.tokenizer.encode(text, add_special=False)   # noqa: E731
        want = [FIM[0]] + enc("def add(a, b):\n    return") + enc(" a") + [FIM[1]] + enc("\n\nprint(add(1, 2))\n") \
            + [FIM[2]]
    body = {"input_prefix": "def add(a, b):\n    return", "input_suffix": "\n\nprint(add(1, 2))\n", "prompt": " a",
            "n_predict": 8, "temperature": 0, "cache_prompt": False}
    status, out = fim_server.post("/infill", body)
    assert status == 200, out
    assert out["prompt"] == want and out["tokens_evaluated"] == len(want)
    status, same = fim_server.post("/completion", {"prompt": want, "n_predict": 8, "temperature": 0,
                                                   "cache_prompt": False})
    assert out["content"] == same["content"]
    status, out = fim_server.post("/infill", {"input_prefix": "x"})
    assert status == 400 and out["error"]["param"] == "input_suffix"
    status, out = fim_server.post("/infill", {"input_prefix": "x", "input_suffix": "y", "input_extra": [{"t": 1}]})
    assert status == 400 and out["error"]["param"] == "input_extra"


def test_infill_needs_fim_tokens(server):
    status, out = server.post("/infill", {"input_prefix": "def f(", "input_suffix": ")"})
    assert status == 400   # llama-server's 501: a request this model cannot serve is the client's to change
    assert out["error"]["message"].startswith("Infill is not supported by this model: prefix token is missing. "
                                              "suffix token is missing. middle token is missing.")


def test_rank_pooling_is_refused():
    result = CliRunner().invoke(cli, ["serve", "-m", "model.gguf", "--pooling", "rank"])
    assert result.exit_code == 2 and "classification head" in result.output
    state = SimpleNamespace(config=SimpleNamespace(embeddings=True), pooling="rank")   # a reranker's GGUF default
    with pytest.raises(ApiError, match="classification head") as exc:
        check_enabled(state, oai=False)
    assert exc.value.status == 501
