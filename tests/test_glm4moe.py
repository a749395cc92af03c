"""GLM-4.5 / 4.6 / 4.5-Air (GGUF `glm4moe`, llama.cpp's src/models/glm4-moe.cpp): the tiny models
against a float64 numpy forward pass written from llama.cpp's graph, prefill and decode, experts in
VRAM and on the host, flash attention and the three-kernel path.

    x = token_embd[tokens]
    per layer:
        h = rms_norm(x) * attn_norm
        q, k, v = attn_q·h + attn_q.bias, attn_k·h + attn_k.bias, attn_v·h + attn_v.bias
        q, k = rms_norm per head * attn_{q,k}_norm   (where the file has them: GLM-4.5 / 4.6)
        q, k = NEOX RoPE of the first rope.dimension_count dims of each head
        x = x + attn_output·softmax(q k^T / sqrt(d) + mask) v
        h = rms_norm(x) * post_attention_norm
        the first leading_dense_block_count layers: x = x + ffn_down·(silu(ffn_gate·h) * ffn_up·h)
        the rest: p = sigmoid(ffn_gate_inp·h); the top k experts by p + exp_probs_b, weighted by p,
                  divided by max(sum, 2^-14) (expert_weights_norm), times expert_weights_scale;
                  x = x + sum_j w_j down_j·(silu(gate_j·h) * up_j·h) + shared expert(h) (ungated)
    logits = output·(rms_norm(x) * output_norm)

Choosing the experts by p alone (no selection bias), softmax gating, or dropping the 2.5 scale
move the reference by far more than the tolerance (test_the_reference_is_sensitive).
"""

import gguf
import numpy as np
import pytest
from hybrid_reference import fresh_logits, glu_ffn, load, routed_sum, rms_norm, rope_neox, sigmoid, softmax
from models import tiny_model
from test_hybrid_reference import check_logits, normalised_error
from test_olmoe import assert_missing_tensor_named, attention, rewrite

from vkrt.errors import VkrtError
from vkrt.memory import F32
from vkrt.model.arch import DENSE, MOE_SHARED, Bias, QKNorm, RopeKind, Router
from vkrt.model.loader import Model

TOKENS = [3, 17, 42, 5, 99, 120, 7, 64, 11, 200, 31, 8, 77, 150, 2, 45]
PREFILL = 12
TIGHT = 1e-4     # normalised error per position, F32 KV cache
F16_KV = 1e-2    # the default F16 KV cache
MODELS = ["tiny-glm4moe", "tiny-glm4moe-air"]


def routed(cfg, w, il, h, *, bias=True, gating="sigmoid", scale=True):
    """The routed experts' sum on h [T, n_embd] (the keywords break one feature each)."""
    p = f"blk.{il}."
    logits = h @ w[p + "ffn_gate_inp.weight"].T
    probs = sigmoid(logits) if gating == "sigmoid" else softmax(logits)
    select = probs + w[p + "exp_probs_b.bias"] if bias else probs

    def weigh(t, top):
        weights = probs[t, top]
        if cfg.expert_weights_norm:
            weights = weights / max(weights.sum(), 6.103515625e-5)
        if scale and cfg.expert_weights_scale not in (0.0, 1.0):
            weights = weights * cfg.expert_weights_scale
        return weights

    return routed_sum(cfg, w, il, h, select, weigh)


def blocks(cfg, w, x, **broken):
    """The residual stream x [T, n_embd] through every layer of `cfg` (`broken`: see routed)."""
    D, eps = cfg.head_dim_k, cfg.norm_eps
    T = x.shape[0]
    for il, layer in enumerate(cfg.layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q, k, v = ((h @ w[p + f"attn_{n}.weight"].T + w[p + f"attn_{n}.bias"]).reshape(T, -1, D) for n in "qkv")
        if p + "attn_q_norm.weight" in w:
            q, k = rms_norm(q, w[p + "attn_q_norm.weight"], eps), rms_norm(k, w[p + "attn_k_norm.weight"], eps)
        q, k = rope_neox(q, cfg.rope_dims, cfg.rope_base), rope_neox(k, cfg.rope_dims, cfg.rope_base)
        x = x + attention(cfg, w, il, q, k, v, 1 / np.sqrt(D))
        h = rms_norm(x, w[p + "post_attention_norm.weight"], eps)
        if layer.ffn == DENSE:
            x = x + glu_ffn(h, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"])
        else:
            shared = glu_ffn(h, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"],
                             w[p + "ffn_down_shexp.weight"])
            x = x + routed(cfg, w, il, h, **broken) + shared
    return x


def forward(path: str, tokens: list[int], **broken) -> np.ndarray:
    """float64 logits [len(tokens), vocab]; `broken`: see routed."""
    cfg, w = load(path, hybrid=False)
    x = blocks(cfg, w, w["token_embd.weight"][np.asarray(tokens)], **broken)
    return rms_norm(x, w["output_norm.weight"], cfg.norm_eps) @ w["output.weight"].T


@pytest.fixture(scope="module", params=MODELS)
def glm(request, tmp_path_factory):
    path = tiny_model(request.param, tmp_path_factory.mktemp("glm4moe"))
    return path, forward(path, TOKENS)


def test_config(device, glm):
    path = glm[0]
    air = path.endswith("-air.gguf")
    with Model(device, path, progress=False) as m:
        cfg = m.cfg
        attn = cfg.spec.attn
        assert cfg.spec.rope.kind is RopeKind.NEOX and cfg.rope_dims == 16 and attn.qkv_bias is Bias.REQUIRED
        assert cfg.spec.moe.router is Router.SIGMOID and attn.qk_norm is (QKNorm.NONE if air else QKNorm.PER_HEAD)
        assert cfg.expert_weights_norm and cfg.expert_weights_scale == (1.0 if air else 2.5)
        assert [layer.ffn for layer in cfg.layers] == [DENSE, MOE_SHARED, MOE_SHARED] and not cfg.spec.moe.shared_gate
        assert cfg.n_ff == 96 and cfg.n_ff_expert == 32 and cfg.n_ff_shared == 32


@pytest.mark.parametrize("n_cpu_moe,flash,kv_type,tol", [(0, True, F32, TIGHT), (0, False, F32, TIGHT),
                                                         (3, True, F32, TIGHT), (0, True, None, F16_KV)])
def test_logits_match_the_numpy_forward(device, glm, n_cpu_moe, flash, kv_type, tol):
    """A 12-token prefill (all logits), then 4 decode steps; n_cpu_moe 3: every MoE layer's experts
    in host memory. kv_type None: the engine's default F16 KV cache."""
    path, ref = glm
    got = fresh_logits(device, path, TOKENS, PREFILL, n_cpu_moe=n_cpu_moe, flash=flash, kv_type=kv_type)
    check_logits(got, ref, tol, f"{path}, n_cpu_moe={n_cpu_moe}, flash={flash}, kv {kv_type}")


@pytest.mark.parametrize("change", [dict(bias=False), dict(gating="softmax"), dict(scale=False)])
def test_the_reference_is_sensitive(glm, change):
    path, ref = glm
    if "scale" in change and path.endswith("-air.gguf"):
        pytest.skip("GLM-4.5-Air's scale is 1")
    worst = normalised_error(forward(path, TOKENS, **change), ref).max()
    assert worst > 10 * F16_KV, f"{change} changes the logits by {worst:.2e} only"


@pytest.mark.parametrize("missing", ["blk.1.exp_probs_b.bias", "blk.0.attn_q.bias", "blk.0.ffn_gate.weight",
                                     "blk.2.ffn_up_shexp.weight"])
def test_missing_tensors_are_named(device, glm, tmp_path, missing):
    assert_missing_tensor_named(device, glm[0], tmp_path, "glm4moe", missing)


@pytest.mark.parametrize("key,message", [("glm4moe.expert_shared_count", r"glm4moe\.expert_shared_count is missing"),
                                         ("glm4moe.expert_feed_forward_length",
                                          r"glm4moe\.expert_feed_forward_length is missing")])
def test_missing_keys_are_named(device, glm, tmp_path, key, message):
    path = rewrite(glm[0], tmp_path / "missing.gguf", "glm4moe", drop_key=key)
    with pytest.raises(VkrtError, match=message):
        Model(device, path, progress=False)


def test_unsupported_gating_is_refused(glm):
    from vkrt.model.config import ModelConfig
    reader = gguf.GGUFReader(glm[0])
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    with pytest.raises(VkrtError, match=r"glm4moe\.expert_gating_func=1 is not supported"):
        ModelConfig.from_metadata({**meta, "glm4moe.expert_gating_func": 1}, "m.gguf")
    with pytest.raises(VkrtError, match=r"rope\.dimension_sections=\[8, 4, 4, 0\]"):
        ModelConfig.from_metadata({**meta, "glm4moe.rope.dimension_sections": [8, 4, 4, 0]}, "m.gguf")


def test_names_are_the_converters(glm):
    """Every tensor is one gguf-py lists for MODEL_ARCH.GLM4_MOE; the keys llama.cpp requires are there."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
    reader = gguf.GGUFReader(glm[0])
    known = {TENSOR_NAMES[t].format(bid=il) for t in MODEL_TENSORS[MODEL_ARCH.GLM4_MOE] for il in range(3)}
    assert {t.name.rsplit(".", 1)[0] for t in reader.tensors} <= known
    for key in ("expert_feed_forward_length", "expert_count", "expert_used_count", "expert_shared_count",
                "leading_dense_block_count", "attention.layer_norm_rms_epsilon"):
        assert f"glm4moe.{key}" in reader.fields, key
