"""Quantised KV caches (-ctk/-ctv) on tiny models: the logits of a prompt (two ubatches) and of
decode steps stay close to the F16 cache's, Q8_0 closer than Q4_0, the top tokens mostly agree;
the recurrent state of qwen35moe stays F32. A quantised cache without flash attention is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models import TINY, tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine.options import EngineOptions
from vkrt.errors import ConfigError
from vkrt.model.loader import Model
from vkrt.model.synthetic import write_model

N_PROMPT, N_DECODE = 40, 6
# largest |logit difference| of a position against the F16 cache's, over its largest |logit|;
# measured on lavapipe (random weights, heads of one block: Q4_0's scale per 32 values shows) at
# most 0.022 (Q8_0, qwen3moe) and 0.52 (Q4_0, qwen3moe); llama 0.014 / 0.25, qwen35moe 0.002 / 0.037
BOUND = {"Q8_0": 0.05, "Q4_0": 0.8}
AGREE = {"Q8_0": 0.95, "Q4_0": 0.7}   # top tokens: measured 100% (Q8_0) and 83 to 96% (Q4_0)


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen3moe", "tiny-qwen35moe"])
def model(request, device, tmp_path_factory):
    """The tiny model with heads of 32 (one block a row; tiny-qwen35moe's are already; llama.cpp
    too needs head sizes that are whole blocks)."""
    spec = dataclasses.replace(TINY[request.param], head_dim=32)
    path = str(tmp_path_factory.mktemp("kvq") / f"{request.param}-hd32.gguf")
    write_model(path, spec)
    with Model(device, path, progress=False) as m:
        yield m


def logits(model, tokens, **kw) -> np.ndarray:
    """Every prompt position's logits (ubatches of 32), then one a decode step, teacher-forced."""
    with Engine(model, n_ctx=128, n_ubatch=32, **kw) as engine:
        out = [engine.eval(tokens[:N_PROMPT], all_logits=True)]
        out += [engine.eval([t])[None] for t in tokens[N_PROMPT:]]
        if engine.state is not None:   # the DeltaNet state keeps F32 whatever the KV cache
            assert {t.type.name for t in (*engine.state.conv.values(), *engine.state.ssm.values())} == {"F32"}
        return np.concatenate(out)


def test_close_to_f16(model):
    rng = np.random.default_rng(4)
    tokens = rng.integers(1, model.cfg.vocab_size, N_PROMPT + N_DECODE).tolist()
    ref = logits(model, tokens)
    errs = {}
    for kv in ("Q8_0", "Q4_0"):
        got = logits(model, tokens, kv_type=kv)
        assert np.isfinite(got).all()
        err = np.abs(got - ref).max(axis=-1) / np.abs(ref).max(axis=-1)
        errs[kv] = float(err.max())
        assert 0 < errs[kv] < BOUND[kv], f"{kv}: worst position {errs[kv]:.3g}"
        agree = (got.argmax(-1) == ref.argmax(-1)).mean()
        assert agree >= AGREE[kv], f"{kv}: top tokens agree at {agree:.0%} of positions"
    assert errs["Q8_0"] < errs["Q4_0"]


def test_separate_k_and_v(model):
    """K and V of different types; the cache names both."""
    with Engine(model, n_ctx=64, kv_type="Q8_0", kv_type_v="IQ4_NL") as engine:
        assert engine.cache.type_name == "Q8_0/IQ4_NL"
        for il, k in engine.cache.k.items():
            assert k.type.name == "Q8_0" and engine.cache.v[il].type.name == "IQ4_NL"
        assert np.isfinite(engine.eval([1, 2, 3])).all()


def test_refused_for_partial_blocks(device, tmp_path):
    """Heads of 16 (tiny-llama's) are not a whole block: refused by option name."""
    with Model(device, tiny_model("tiny-llama", tmp_path), progress=False) as m:
        with pytest.raises(ConfigError, match=r"-ctv q4_0: a Q4_0 KV cache needs head sizes that are multiples of 32"):
            Engine(m, n_ctx=64, kv_type_v="Q4_0")


def test_refused_without_flash_attention(model):
    with pytest.raises(ConfigError, match=r"-ctk/-ctv.*-fa on"):
        Engine(model, n_ctx=64, flash_attn=False, kv_type_v="Q4_0")
    with pytest.raises(ConfigError, match=r"-ctk/-ctv.*-fa on"):
        EngineOptions(flash_attn=False, cache_type_k="q8_0")
    with pytest.raises(ConfigError, match="-ctv"):
        EngineOptions(cache_type_v="q3_k")


def test_saved_rows_restore_bit_for_bit(model):
    """The prompt cache's and slot files' copies hold the quantised rows as stored (row bytes of
    the type) and a sequence given them back continues bit for bit."""
    from vkrt.engine.kv_transfer import kv_layout, read_kv, read_state, write_kv, write_state
    prompt, more = list(range(5, 45, 2)), list(range(100, 110))
    with Engine(model, n_ctx=64, n_ubatch=32, kv_type="Q4_0", kv_type_v="Q8_0") as e:
        layout = kv_layout(e)
        assert layout["kv_type"] == "Q4_0/Q8_0"
        assert {tuple(v[:2]) for v in layout["layers"].values()} == {(18, 34)}   # heads of 32
        e.eval(prompt)
        block, state = read_kv(e, 0, len(prompt)), read_state(e, 0)
        fresh = e.eval(more, all_logits=True)
        e.reset()
        write_kv(e, 0, block)
        write_state(e, 0, state, len(prompt))
        np.testing.assert_array_equal(e.eval(more, all_logits=True), fresh)


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen35moe"])
def model64(request, device, tmp_path_factory):
    """Heads of 64, where a quantised cache is stored rotated (tiny-qwen35moe: gated attention,
    whose gate must meet the output after it is rotated back)."""
    spec = dataclasses.replace(TINY[request.param], head_dim=64)
    path = str(tmp_path_factory.mktemp("kvq64") / f"{request.param}-hd64.gguf")
    write_model(path, spec)
    with Model(device, path, progress=False) as m:
        yield m


@pytest.mark.parametrize("k,v,runs", [("Q8_0", "Q8_0", (64, 64)), ("Q4_0", "F16", (64, 0)), ("F16", "Q4_0", (0, 64))])
def test_rotated_cache_keeps_attention(model64, device_env, k, v, runs):
    """K with the queries, and V with attention's output, rotated as llama.cpp rotates them: each
    side alone and both stay as close to the F16 cache's logits as the bound for their types (a
    side rotated and not rotated back would not); with VKRT_KV_ROTATION=0 the rows are stored as
    they come, which gives other logits."""
    rng = np.random.default_rng(9)
    tokens = rng.integers(1, model64.cfg.vocab_size, N_PROMPT + N_DECODE).tolist()
    ref = logits(model64, tokens)
    with Engine(model64, n_ctx=64, kv_type=k, kv_type_v=v) as e:
        assert (e.cache.k_rot, e.cache.v_rot) == runs
    got = logits(model64, tokens, kv_type=k, kv_type_v=v)
    bound = BOUND["Q4_0" if "Q4_0" in (k, v) else "Q8_0"]
    err = np.abs(got - ref).max(axis=-1) / np.abs(ref).max(axis=-1)
    assert 0 < err.max() < bound, f"{k}/{v}: worst position {err.max():.3g}"
    device_env("VKRT_KV_ROTATION", "0")
    with Engine(model64, n_ctx=64, kv_type=k, kv_type_v=v) as e:
        assert (e.cache.k_rot, e.cache.v_rot) == (0, 0)
    plain = logits(model64, tokens, kv_type=k, kv_type_v=v)
    assert not np.array_equal(plain, got)
    err_plain = np.abs(plain - ref).max(axis=-1) / np.abs(ref).max(axis=-1)
    assert err_plain.max() < bound


def _logits_and_dispatches(model, tokens, **kw):
    """logits(), the dispatches its graphs recorded and the graphs."""
    with Engine(model, n_ctx=128, n_ubatch=32, **kw) as engine:
        out = [engine.eval(tokens[:N_PROMPT], all_logits=True)]
        out += [engine.eval([t])[None] for t in tokens[N_PROMPT:]]
        graphs = engine.steps.graphs.values()
        return np.concatenate(out), sum(s.dispatch_count for g in graphs for s in g.seqs), len(graphs)


def _same_logits(model, device_env, seed: int, fusions: tuple, **kw):
    """((dispatches under each VKRT_FUSE value of `fusions`), the graphs): random tokens' logits,
    the same bits under each."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, model.cfg.vocab_size, N_PROMPT + N_DECODE).tolist()
    runs = []
    for fuse in fusions:
        device_env("VKRT_FUSE", fuse)
        runs.append(_logits_and_dispatches(model, tokens, **kw))
    for logits, _, _ in runs[1:]:
        np.testing.assert_array_equal(runs[0][0].view(np.uint32), logits.view(np.uint32))
    return tuple(n for _, n, _ in runs), runs[0][2]


@pytest.mark.parametrize("k,v,fewer", [("Q8_0", "Q8_0", 6), ("Q4_0", "F16", 4), ("F16", "Q4_0", 2)])
def test_rotated_cache_stores_in_norm_rope_are_bit_identical(model64, device_env, k, v, fewer):
    """norm_rope rotates and quantises a cache's rows as it stores them (the queries rotated
    riding along, V's store in K's dispatch where both caches are one type): the logits of
    rope, hadamard and set_rows apart, `fewer` dispatches a layer with attention a graph (2 more
    with qwen35moe's q/k norms)."""
    (n_apart, n_fused), graphs = _same_logits(model64, device_env, 12, ("all,-norm_rope", "all,-fa_rope"),
                                              kv_type=k, kv_type_v=v)
    per_layer = fewer + (2 if model64.cfg.arch == "qwen35moe" else 0)
    assert n_apart - n_fused == graphs * len(model64.cfg.kv_layers) * per_layer


def test_rotated_queries_in_their_own_norm_rope(model64, device_env):
    """The queries' norm_rope apart from K's (qk_rope off) rotates them as K's rides: the bits of
    the kernels apart, one dispatch more a layer a graph than with them riding."""
    (_, n_own, n_riding), graphs = _same_logits(model64, device_env, 13,
                                                ("all,-norm_rope", "all,-fa_rope,-qk_rope", "all,-fa_rope"),
                                                kv_type="Q8_0")
    assert n_own - n_riding == graphs * len(model64.cfg.kv_layers)


@pytest.mark.parametrize("k,v", [("Q8_0", "Q8_0"), ("Q4_0", "F16"), ("F16", "Q4_0")])
def test_quantised_cache_stores_in_the_attention_prologue(model64, device_env, k, v):
    """A decode step's attention rotates, quantises and stores the new cell of a quantised cache
    in its prologue (fa_rope): the logits of norm_rope's stores and the attention apart, one
    dispatch fewer a layer with attention in each one-token graph."""
    (n_apart, n_fused), _ = _same_logits(model64, device_env, 14, ("all,-fa_rope", "all"), kv_type=k, kv_type_v=v)
    layers = len(model64.cfg.kv_layers)
    assert n_apart > n_fused and (n_apart - n_fused) % layers == 0
