"""Phi-3 / Phi-4-mini (GGUF `phi3`, llama.cpp's phi3 graph): the tiny model against a float64
numpy forward written from that graph, prefill and decode, at a context past the original one
(long LongRoPE factors) and at the original one (short factors).

    x = token_embd[tokens]
    per layer:
        h = rms_norm(x) * attn_norm
        q, k, v = rows of attn_qkv·h (n_head * d, n_head_kv * d, n_head_kv * d)
        q, k = NEOX RoPE with theta_i = pos * base^(-2i/d) / factors[i], cos and sin times
               rope.scaling.attn_factor; factors = rope_factors_long when the context (n_ctx)
               exceeds rope.scaling.original_context_length, else rope_factors_short
        x = x + attn_output·softmax(q k^T / sqrt(d) + mask) v
        h = rms_norm(x) * ffn_norm;  g, u = rows 0..n_ff-1, n_ff..2n_ff-1 of ffn_up·h
        x = x + ffn_down·(silu(g) * u)
    logits = output·(rms_norm(x) * output_norm)

Swapping the gate and up halves, the long and short factors, or dropping the attention factor
moves the reference by far more than the tolerance (test_the_reference_is_sensitive).
"""

import dataclasses

import numpy as np
import pytest
from hybrid_reference import load, prompt_then_decode, rms_norm, silu
from models import TINY, tiny_model
from test_hybrid_reference import check_logits, normalised_error
from test_olmoe import attention

from vkrt.engine.engine import Engine
from vkrt.errors import GGUFError
from vkrt.memory import F32
from vkrt.model.arch import Packing, RopeKind
from vkrt.model.loader import Model
from vkrt.model.synthetic import write_model

TOKENS = [3, 17, 42, 5, 99, 120, 7, 64, 11, 200, 31, 8, 77, 150, 2, 45]
PREFILL = 12
TIGHT = 1e-4     # normalised error per position, F32 KV cache
F16_KV = 1e-2    # the default F16 KV cache
LONG_CTX, SHORT_CTX = 64, 32   # the tiny model's original context is 32


def rope_long(x, base: float, factors, attn_factor: float):
    """NEOX RoPE over whole heads of x [T, H, D] with LongRoPE's divisors and magnitude."""
    T, half = x.shape[0], x.shape[-1] // 2
    theta = np.arange(T)[:, None] * base ** (-2.0 * np.arange(half) / (2 * half)) / factors   # [T, half]
    cos, sin = (attn_factor * np.cos(theta))[:, None], (attn_factor * np.sin(theta))[:, None]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def forward(path: str, tokens: list[int], n_ctx: int, *, swap_gate_up=False, swap_factors=False,
            no_attn_factor=False) -> np.ndarray:
    """float64 logits [len(tokens), vocab] at context n_ctx; the keywords break one feature."""
    cfg, w = load(path, hybrid=False)
    H, KV, D, eps, F = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.norm_eps, cfg.n_ff
    long = (n_ctx > cfg.n_ctx_orig_yarn) != swap_factors
    factors = w["rope_factors_long.weight" if long else "rope_factors_short.weight"]
    attn_factor = 1.0 if no_attn_factor else cfg.rope_attn_factor
    x = w["token_embd.weight"][np.asarray(tokens)]
    T = x.shape[0]
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        fused = w.get(p + "attn_qkv.weight")   # or a file's attn_q / attn_k / attn_v, read as one
        if fused is None:
            fused = np.concatenate([w[p + f"attn_{n}.weight"] for n in "qkv"])
        qkv = h @ fused.T
        q, k, v = qkv[:, :H * D], qkv[:, H * D:(H + KV) * D], qkv[:, (H + KV) * D:]
        q = rope_long(q.reshape(T, H, D), cfg.rope_base, factors, attn_factor)
        k = rope_long(k.reshape(T, KV, D), cfg.rope_base, factors, attn_factor)
        x = x + attention(cfg, w, il, q, k, v.reshape(T, KV, D), 1 / np.sqrt(D))
        gu = rms_norm(x, w[p + "ffn_norm.weight"], eps) @ w[p + "ffn_up.weight"].T
        g, u = (gu[:, F:], gu[:, :F]) if swap_gate_up else (gu[:, :F], gu[:, F:])
        x = x + (silu(g) * u) @ w[p + "ffn_down.weight"].T
    return rms_norm(x, w["output_norm.weight"], eps) @ w["output.weight"].T


def logits(device, path, n_ctx, flash=True, kv_type=F32, **model_kw):
    kw = {"kv_type": kv_type} if kv_type else {}
    with Model(device, path, progress=False, **model_kw) as m, \
            Engine(m, n_ctx=n_ctx, n_ubatch=32, flash_attn=flash, **kw) as e:
        return prompt_then_decode(e, TOKENS, PREFILL)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    return tiny_model("tiny-phi3", tmp_path_factory.mktemp("phi3"))


def test_config(device, phi3):
    with Model(device, phi3, progress=False) as m:
        cfg = m.cfg
        assert cfg.spec.attn.qkv is Packing.FUSED and cfg.spec.ffn.gate_up is Packing.FUSED
        assert cfg.spec.rope.long_rope and cfg.spec.rope.kind is RopeKind.NEOX
        assert cfg.n_ctx_orig_yarn == 32 and abs(cfg.rope_attn_factor - 1.19) < 1e-6 and cfg.sliding_window == 0
        w = m.weights
        assert "blk.0.attn_qkv.weight" not in w and w["blk.0.attn_v.weight"].ne[:2] == (64, 32)
        gate, up = w["blk.1.ffn_gate.weight"], w["blk.1.ffn_up.weight"]   # views into the one ffn_up
        assert gate.ne[:2] == up.ne[:2] == (64, cfg.n_ff) and gate.buffer is up.buffer
        assert up.offset - gate.offset == cfg.n_ff * gate.nb[1]


@pytest.mark.parametrize("n_ctx,flash,kv_type,tol", [(LONG_CTX, True, F32, TIGHT), (LONG_CTX, False, F32, TIGHT),
                                                     (SHORT_CTX, True, F32, TIGHT), (LONG_CTX, True, None, F16_KV)])
def test_logits_match_the_numpy_forward(device, phi3, n_ctx, flash, kv_type, tol):
    """A 12-token prefill (all logits), then 4 decode steps; kv_type None: the default F16 cache."""
    got = logits(device, phi3, n_ctx, flash=flash, kv_type=kv_type)
    check_logits(got, forward(phi3, TOKENS, n_ctx), tol, f"tiny-phi3, n_ctx={n_ctx}, flash={flash}, kv {kv_type}")


def test_host_resident_layers(device, phi3):
    """-ngl 1: the first layer's fused weights (and their views) read from host memory."""
    check_logits(logits(device, phi3, LONG_CTX, n_gpu_layers=1), forward(phi3, TOKENS, LONG_CTX), TIGHT,
                 "tiny-phi3, -ngl 1")


@pytest.mark.parametrize("change", ["swap_gate_up", "swap_factors", "no_attn_factor"])
def test_the_reference_is_sensitive(phi3, change):
    ref = forward(phi3, TOKENS, LONG_CTX)
    worst = normalised_error(forward(phi3, TOKENS, LONG_CTX, **{change: True}), ref).max()
    assert worst > 10 * F16_KV, f"{change} changes the logits by {worst:.2e} only"


def test_separate_projections(device, tmp_path):
    """A file with attn_q / attn_k / attn_v (llama.cpp takes either form)."""
    path = write_model(tmp_path / "phi3-qkv.gguf", dataclasses.replace(TINY["tiny-phi3"], qkv_fused=False))
    with Model(device, path, progress=False) as m:
        assert m.cfg.spec.attn.qkv is Packing.SEPARATE
    check_logits(logits(device, path, LONG_CTX), forward(path, TOKENS, LONG_CTX), TIGHT, "tiny-phi3 with attn_q/k/v")


def test_fused_biases_are_refused(phi3):
    from vkrt.model.config import ModelConfig
    from vkrt.model.gguf_file import GGUFFile
    from vkrt.model.tensors import check_tensors, file_layout
    with GGUFFile(phi3, progress=False) as f:
        meta, tensors = dict(f.metadata), dict(f.tensors)
    cfg = file_layout(ModelConfig.from_metadata(meta, "m.gguf"), tensors)
    bias = dataclasses.replace(tensors["blk.0.attn_norm.weight"], name="blk.0.attn_qkv.bias")
    with pytest.raises(GGUFError, match=r"blk\.0\.attn_qkv\.bias"):
        check_tensors(cfg, {**tensors, bias.name: bias}, "m.gguf")


def test_wrong_gate_up_size_is_named(phi3):
    """An ffn_up of n_ff rows (no gate half) is a shape error naming it."""
    from vkrt.model.config import ModelConfig
    from vkrt.model.gguf_file import GGUFFile
    from vkrt.model.tensors import check_tensors, file_layout
    with GGUFFile(phi3, progress=False) as f:
        meta, tensors = dict(f.metadata), dict(f.tensors)
    cfg = file_layout(ModelConfig.from_metadata(meta, "m.gguf"), tensors)
    up = tensors["blk.0.ffn_up.weight"]
    with pytest.raises(GGUFError, match=r"blk\.0\.ffn_up\.weight has shape \[64, 128\], expected \[64, 256\]"):
        check_tensors(cfg, {**tensors, up.name: dataclasses.replace(up, ne=(64, 128))}, "m.gguf")


def test_sliding_window_is_not_applied(tmp_path, caplog):
    """As llama.cpp (its Phi SWA is disabled): every layer attends to the whole context, warned."""
    from vkrt.model.arch import FULL
    from vkrt.model.config import ModelConfig
    from vkrt.model.gguf_file import GGUFFile
    path = write_model(tmp_path / "phi3-swa.gguf", dataclasses.replace(TINY["tiny-phi3"], sliding_window=8))
    with GGUFFile(path, progress=False) as f:
        meta = dict(f.metadata)
    with caplog.at_level("WARNING", logger="vkrt"):
        cfg = ModelConfig.from_metadata(meta, "m.gguf")
    assert cfg.sliding_window == 0 and all(layer.attn == FULL for layer in cfg.layers)
    assert "phi3.attention.sliding_window is not applied" in caplog.text
