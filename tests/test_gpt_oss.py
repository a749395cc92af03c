"""gpt-oss (GGUF `gpt-oss`, llama.cpp's openai-moe graph): the tiny model against a float64 numpy
forward pass written from llama.cpp's graph, prefill and decode, experts in VRAM and on the host,
flash attention and the three-kernel path.

    x = token_embd[tokens]
    per layer (even layers: a sliding window of `sliding_window` positions; odd: everything):
        h = rms_norm(x) * attn_norm
        q, k, v = attn_{q,k,v}·h + bias;  q, k = NEOX RoPE with YaRN (base, factor, original context)
        a = softmax(q k^T / sqrt(d) + mask, with attn_sinks[head] in each row's denominator) v
        x = x + attn_output·a + attn_output.bias
        h = rms_norm(x) * post_attention_norm
        logits = ffn_gate_inp·h + bias;  the top k experts, weighted by the softmax of their logits
        x = x + sum_j w_j (down_j·swiglu_oai(gate_j·h + b, up_j·h + b) + b)
    logits = output·(rms_norm(x) * output_norm)

vkrt computes in fp32: with an F32 KV cache it lands within 2.4e-6 of a position's largest logit
(TIGHT leaves ~40x); the default F16 KV cache rounds K and V, 3.0e-3 at worst here (YaRN's
magnitude, 1.35 on q and k, sharpens the softmax; F16_KV leaves ~3x). Dropping the sinks, the
expert and router biases, YaRN (plain RoPE) or the sliding window from the reference moves the
logits by more than 1 (test_the_reference_is_sensitive), so each is checked.
"""

import dataclasses

import numpy as np
import pytest
import gguf
from hybrid_reference import load, prompt_then_decode, rms_norm, softmax
from models import tiny_model
from test_hybrid_reference import check_logits, normalised_error

from vkrt.engine.engine import Engine
from vkrt.errors import GGUFError
from vkrt.memory import F32
from vkrt.model.arch import FULL, MOE, SLIDING, Router
from vkrt.model.loader import Model

TOKENS = [3, 17, 42, 5, 99, 120, 7, 64, 11, 200, 31, 8, 77, 150, 2, 45, 19, 230, 6, 88]
PREFILL = 12
TIGHT = 1e-4     # normalised error per position, F32 KV cache
F16_KV = 1e-2    # the default F16 KV cache


def rope_yarn(x, cfg, yarn: bool = True):
    """NEOX RoPE at positions 0..T-1 of x [T, H, D] with ggml's rope_yarn (ops.cpp): per pair i the
    extrapolated angle pos * base^(-2i/D) and the interpolated one (times freq_scale) mixed by a
    ramp falling from 1 to 0 between the correction dims; cos and sin times attn_factor *
    (1 + 0.1 ln(1 / freq_scale)). yarn False: plain RoPE (for the sensitivity check)."""
    T, D = x.shape[0], x.shape[-1]
    half = D // 2
    i = np.arange(half)
    extrap = np.arange(T)[:, None] * cfg.rope_base ** (-2.0 * i / D)
    theta, mscale = extrap, 1.0
    if yarn:
        def corr_dim(n_rot):
            return D * np.log(cfg.n_ctx_orig_yarn / (n_rot * 2 * np.pi)) / (2 * np.log(cfg.rope_base))
        low, high = max(0.0, np.floor(corr_dim(32.0))), min(D - 1.0, np.ceil(corr_dim(1.0)))
        ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
        theta = cfg.rope_scale * extrap * (1 - ramp) + extrap * ramp
        mscale = cfg.rope_attn_factor * (1 + 0.1 * np.log(1 / cfg.rope_scale))
    cos, sin = (np.cos(theta) * mscale)[:, None], (np.sin(theta) * mscale)[:, None]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def swiglu_oai(g, u):
    g = np.minimum(g, 7.0)
    return g / (1 + np.exp(-1.702 * g)) * (np.clip(u, -7.0, 7.0) + 1)


def forward(path: str, tokens: list[int], *, sinks=True, biases=True, yarn=True, window=True) -> np.ndarray:
    """float64 logits [len(tokens), vocab]; the keywords drop one feature each (sensitivity checks)."""
    cfg, w = load(path, hybrid=False)
    H, KV, D, eps = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.norm_eps
    x = w["token_embd.weight"][np.asarray(tokens)]
    T = x.shape[0]
    pos = np.arange(T)
    causal = pos[None, :] <= pos[:, None]
    near = causal & (pos[:, None] - pos[None, :] < cfg.sliding_window)

    def bias(name, shape):
        return w[name] if biases else np.zeros(shape)

    for il, layer in enumerate(cfg.layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = rope_yarn((h @ w[p + "attn_q.weight"].T + w[p + "attn_q.bias"]).reshape(T, H, D), cfg, yarn)
        k = rope_yarn((h @ w[p + "attn_k.weight"].T + w[p + "attn_k.bias"]).reshape(T, KV, D), cfg, yarn)
        v = (h @ w[p + "attn_v.weight"].T + w[p + "attn_v.bias"]).reshape(T, KV, D)
        visible = near if layer.attn == SLIDING and window else causal
        att = np.zeros((T, H, D))
        for hd in range(H):
            kv = hd // (H // KV)
            s = np.where(visible, q[:, hd] @ k[:, kv].T / np.sqrt(D), -np.inf)
            if sinks:   # a column of the sink's score whose value is zero
                sink = np.full((T, 1), w[p + "attn_sinks.weight"][hd])
                att[:, hd] = softmax(np.concatenate([s, sink], axis=1))[:, :T] @ v[:, kv]
            else:
                att[:, hd] = softmax(s) @ v[:, kv]
        x = x + att.reshape(T, H * D) @ w[p + "attn_output.weight"].T + w[p + "attn_output.bias"]
        h2 = rms_norm(x, w[p + "post_attention_norm.weight"], eps)
        logits = h2 @ w[p + "ffn_gate_inp.weight"].T + bias(p + "ffn_gate_inp.bias", cfg.n_expert)
        gates, ups, downs = (w[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
        bg, bu = (bias(p + f"ffn_{n}_exps.bias", (cfg.n_expert, cfg.n_ff_expert)) for n in ("gate", "up"))
        bd = bias(p + "ffn_down_exps.bias", (cfg.n_expert, cfg.n_embd))
        for t in range(T):
            top = np.argsort(-logits[t], kind="stable")[:cfg.n_expert_used]
            for e, we in zip(top, softmax(logits[t, top])):
                act = swiglu_oai(gates[e] @ h2[t] + bg[e], ups[e] @ h2[t] + bu[e])
                x[t] += we * (downs[e] @ act + bd[e])
    return rms_norm(x, w["output_norm.weight"], eps) @ w["output.weight"].T


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    path = tiny_model("tiny-gpt-oss", tmp_path_factory.mktemp("gpt-oss"))
    return path, forward(path, TOKENS)


def test_config(device, gpt_oss):
    """Layers alternate sliding (even) and full attention, every FFN routed; YaRN as the file says."""
    with Model(device, gpt_oss[0], progress=False) as m:
        cfg = m.cfg
        assert [layer.attn for layer in cfg.layers] == [SLIDING, FULL, SLIDING, FULL]
        assert all(layer.ffn == MOE for layer in cfg.layers) and cfg.sliding_window == 8
        assert cfg.rope_scale == 1 / 32 and cfg.rope_ext_factor == 1.0 and cfg.n_ctx_orig_yarn == 4096
        assert cfg.rope_base_swa == cfg.rope_base == 150000.0 and abs(cfg.rope_attn_factor - 1) < 1e-6
        moe = cfg.spec.moe
        assert cfg.spec.attn.sinks and moe.expert_bias and moe.router is Router.CHOSEN_SOFTMAX
        assert cfg.spec.ffn.activation == "swiglu_oai"
        assert all(not n.startswith("blk.") or not n.endswith("_exps.bias") for n in m.placement.host_tensors)


@pytest.mark.parametrize("host,flash,kv_type,tol", [(None, True, F32, TIGHT), (None, False, F32, TIGHT),
                                                    ("cached", True, F32, TIGHT), ("in place", False, F32, TIGHT),
                                                    (None, True, None, F16_KV)])
def test_logits_match_the_numpy_forward(device, gpt_oss, host, flash, kv_type, tol):
    """A 12-token prefill (all logits; past the 8-token window), then 8 decode steps. host: every
    layer's experts in host memory (their biases stay in VRAM): prefill uploads them ahead into
    prefetch slots, decode copies the chosen ones into the expert cache ("cached") or reads them
    where they lie ("in place"). kv_type None: the engine's default F16 KV cache."""
    path, ref = gpt_oss
    kw = {"kv_type": kv_type} if kv_type else {}
    if host == "in place":
        kw.update(stage_experts=False, expert_cache=0)
    with Model(device, path, progress=False, n_cpu_moe=4 if host else 0) as m, \
            Engine(m, n_ctx=128, n_ubatch=64, flash_attn=flash, **kw) as e:
        assert len(m.placement.host_tensors) == (12 if host else 0)
        assert bool(e.staging.layers) == (host == "cached") and e.prefetch.active == bool(host)
        got = prompt_then_decode(e, TOKENS, PREFILL)
    check_logits(got, ref, tol, f"tiny-gpt-oss, experts {host or 'in VRAM'}, flash={flash}, "
                 f"kv {kv_type}")


@pytest.mark.parametrize("drop", ["sinks", "biases", "yarn", "window"])
def test_the_reference_is_sensitive(gpt_oss, drop):
    """Each feature moves the logits by far more than the tolerance: a vkrt that skipped it fails."""
    path, ref = gpt_oss
    worst = normalised_error(forward(path, TOKENS, **{drop: False}), ref).max()
    assert worst > 10 * F16_KV, f"dropping {drop} changes the logits by {worst:.2e} only"


@pytest.mark.parametrize("missing", ["blk.1.attn_sinks.weight", "blk.0.attn_q.bias", "blk.2.ffn_down_exps.bias"])
def test_missing_tensors_are_named(device, gpt_oss, tmp_path, missing):
    """A gpt-oss file without a layer's attn_sinks or one of its biases (llama.cpp requires them
    all): a clear error naming the tensor."""
    reader = gguf.GGUFReader(gpt_oss[0])
    out = tmp_path / "missing.gguf"
    w = gguf.GGUFWriter(str(out), "gpt-oss")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            w.add_key_value(field.name, field.contents(), field.types[0],
                            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if t.name != missing:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match=missing.replace(".", r"\.")):
        Model(device, str(out), progress=False)


def test_bad_metadata_and_shapes_are_named(gpt_oss):
    """No sliding window (llama.cpp requires it for gpt-oss), an unknown RoPE scaling type and an
    expert bias of the wrong shape: each a clear error naming what is wrong."""
    from vkrt.model.config import ConfigMissing, ModelConfig
    from vkrt.model.gguf_file import GGUFFile
    from vkrt.model.tensors import check_tensors
    with GGUFFile(gpt_oss[0], progress=False) as f:
        meta, tensors = dict(f.metadata), f.tensors
    cfg = ModelConfig.from_metadata(meta, "m.gguf")
    bias = tensors["blk.2.ffn_up_exps.bias"]
    with pytest.raises(GGUFError, match=r"blk\.2\.ffn_up_exps\.bias has shape \[64, 1, 1, 1\], expected \[64, 8\]"):
        check_tensors(cfg, {**tensors, bias.name: dataclasses.replace(bias, ne=(64, 1, 1, 1))}, "m.gguf")
    with pytest.raises(ConfigMissing, match="rope.scaling.type='longrope' is not supported"):
        ModelConfig.from_metadata({**meta, "gpt-oss.rope.scaling.type": "longrope"}, "m.gguf")
    del meta["gpt-oss.attention.sliding_window"]
    with pytest.raises(ConfigMissing, match="gpt-oss.attention.sliding_window is missing"):
        ModelConfig.from_metadata(meta, "m.gguf")


def test_names_are_the_converters(gpt_oss):
    """Every tensor of the file is one gguf-py lists for MODEL_ARCH.GPT_OSS (what llama.cpp's
    converter writes and loads), as .weight or .bias; the keys llama.cpp reads are there."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
    reader = gguf.GGUFReader(gpt_oss[0])
    names = {TENSOR_NAMES[t].format(bid=il) for t in MODEL_TENSORS[MODEL_ARCH.GPT_OSS] for il in range(4)}
    stray = [t.name for t in reader.tensors if t.name.rsplit(".", 1)[0] not in names]
    assert not stray and len(reader.tensors) == 3 + 4 * 19
    keys = set(reader.fields)
    for key in ("context_length", "embedding_length", "block_count", "attention.head_count",
                "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "attention.sliding_window",
                "expert_count", "expert_used_count", "expert_feed_forward_length", "rope.freq_base",
                "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length"):
        assert f"gpt-oss.{key}" in keys, key
    assert reader.fields["tokenizer.ggml.pre"].contents() == "gpt-4o"
