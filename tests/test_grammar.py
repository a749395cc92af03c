"""Constrained decoding (vkrt/engine/grammar.py): the GPU-masked candidates are those of the
host-masked row, and generation under a JSON schema or a GBNF grammar always fits it."""

import json

import numpy as np
import pytest

from grammar_schemas import check, random_schema
from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.grammar import Constraint, GrammarError, grammar_tokenizer
from vkrt.engine.grammar_compile import gbnf_grammar, json_schema_grammar
from vkrt.engine.sampler import GREEDY, SamplingParams
from vkrt.model.loader import Model

PROMPT = [5, 9, 2, 11, 3, 7, 1, 4]
SAMPLED = SamplingParams(temperature=1.0, top_k=40, top_p=0.95, min_p=0.0, seed=3)


@pytest.fixture(scope="module")
def engine(device, tmp_path_factory):
    path = tiny_model("tiny-llama", tmp_path_factory.mktemp("grammar"))
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=512, n_ubatch=16) as e:
        yield e


def constraint(engine, grammar: str) -> Constraint:
    m = engine.model
    return Constraint(grammar_tokenizer(m.tokenizer, m.cfg.vocab_size), grammar)


def test_masked_candidates_are_the_best_of_the_host_masked_row(engine):
    c = constraint(engine, json_schema_grammar({"type": "object", "properties": {"x": {"type": "integer"}}}))
    for t in engine.model.tokenizer.encode('{"x": 1', add_special=False):
        c.accept(t)
    mask = c.mask()
    engine.reset()
    engine.eval(PROMPT[:-1])
    values, ids = (a[0] for a in engine.decode_candidates([(0, PROMPT[-1])], [None], [mask]))
    engine.reset()
    row = c.apply(engine.eval(PROMPT))
    allowed = np.isfinite(row)
    assert 1 < allowed.sum() < 64   # digits, '}' and ',' (whole or with blanks): fewer than the candidates
    order = np.lexsort((np.arange(row.size), -row.astype(np.float64)))[:len(ids)]
    n = int(allowed.sum())
    assert ids[:n].tolist() == order[:n].tolist()
    np.testing.assert_array_equal(values[:n], row[order[:n]])
    assert np.all(values[n:] == -np.inf)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED, SamplingParams(temperature=0.7, top_k=0, seed=5)],
                         ids=["greedy", "candidates", "whole-row"])
@pytest.mark.parametrize("seed", range(4))
def test_json_schema_output_parses_and_fits(engine, params, seed):
    schema = random_schema(seed)
    c = constraint(engine, json_schema_grammar(schema))
    engine.reset()
    tok = engine.model.tokenizer
    gen = generate(engine, PROMPT, 400, params, stop_tokens=tok.eog_ids, grammar=c)
    text = tok.decode(gen.tokens, skip_special=True)
    assert gen.stop_reason == "eos", (text, schema)
    check(json.loads(text), schema)
    assert c.accepting and c.masks >= len(gen.tokens)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_gbnf_output_is_an_allowed_string(engine, params):
    c = constraint(engine, gbnf_grammar('root ::= "yes" | "no" | "maybe later"'))
    engine.reset()
    tok = engine.model.tokenizer
    gen = generate(engine, PROMPT, 50, params, stop_tokens=tok.eog_ids, grammar=c)
    assert tok.decode(gen.tokens) in ("yes", "no", "maybe later")
    assert gen.stop_reason == "eos"


@pytest.mark.parametrize("bad", [{"type": "objectx"}, "{not json", 5])
def test_a_bad_schema_is_refused_with_the_library_message(bad):
    with pytest.raises(GrammarError) as err:
        json_schema_grammar(bad)
    assert str(err.value)


def test_a_bad_gbnf_grammar_is_refused():
    with pytest.raises(GrammarError, match="foo"):
        gbnf_grammar("root ::= foo")


def test_vkrt_run_takes_a_grammar_and_a_schema(tmp_path):
    from click.testing import CliRunner

    from vkrt.cli.main import cli
    path = tiny_model("tiny-llama", tmp_path)
    base = ["run", "-m", path, "-p", "Answer:", "-n", "40", "--temp", "0", "-c", "256", "--json"]
    out = CliRunner().invoke(cli, base + ["--grammar", 'root ::= "yes" | "no"'])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output.strip().splitlines()[-1])["text"] in ("yes", "no")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    out = CliRunner().invoke(cli, base + ["--json-schema", json.dumps(schema)])
    assert out.exit_code == 0, out.output
    assert 0 <= json.loads(json.loads(out.output.strip().splitlines()[-1])["text"])["n"] <= 99
    out = CliRunner().invoke(cli, base + ["--grammar", "root ::= nope"])
    assert out.exit_code == 2 and "--grammar" in out.output and "nope" in out.output


def test_plain_text_user_defined_tokens_are_text_to_the_grammar(tmp_path):
    """Gemma 3 holds "\\n" and blank runs as user-defined tokens: a grammar's newline must allow
    that token (llguidance took every user-defined token for a special one, which has no text)."""
    import gguf

    from vkrt.model.tokenizer import TOKEN_USER_DEFINED, Tokenizer
    reader = gguf.GGUFReader(tiny_model("tiny-qwen3", tmp_path))
    meta = {}
    for key, f in reader.fields.items():
        try:
            meta[key] = f.contents()
        except Exception:   # values gguf cannot render are not the tokenizer's
            pass
    meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"]) + ["\n", "<tag>"]
    meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [TOKEN_USER_DEFINED] * 2
    tok = Tokenizer.from_metadata(meta)
    newline = len(tok.tokens) - 2
    ids = tok.encode('{\n"x": 5}', add_special=False)
    assert newline in ids
    llt = grammar_tokenizer(tok, len(tok.tokens))
    c = Constraint(llt, json_schema_grammar({"type": "object", "properties": {"x": {"type": "integer"}}}))
    for t in ids:
        assert c.mask()[t // 32] >> (t % 32) & 1, (t, tok.tokens[t])
        c.accept(t)
    assert c.accepting and not llt.is_special_token(newline) and llt.is_special_token(newline + 1)
