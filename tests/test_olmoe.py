"""OLMoE (GGUF `olmoe`, llama.cpp's olmoe graph): the tiny model against a float64 numpy forward
pass written from llama.cpp's graph, prefill and decode, experts in VRAM and on the host, flash
attention and the three-kernel path.

    x = token_embd[tokens]
    per layer:
        h = rms_norm(x) * attn_norm
        q = rms_norm(attn_q·h) * attn_q_norm     (over each token's whole q: n_head * head_dim)
        k = rms_norm(attn_k·h) * attn_k_norm     (whole k), v = attn_v·h;  q, k = NEOX RoPE
        x = x + attn_output·softmax(q k^T / sqrt(d) + mask) v
        h = rms_norm(x) * ffn_norm
        p = softmax(ffn_gate_inp·h);  the top k experts weighted by p (not renormalised)
        x = x + sum_j p_j down_j·(silu(gate_j·h) * up_j·h)
    logits = output·(rms_norm(x) * output_norm)

Per-head q/k norms (qwen3's) or renormalised routing weights move the reference by far more
than the tolerance (test_the_reference_is_sensitive).
"""

import dataclasses

import numpy as np
import pytest
import gguf
from hybrid_reference import fresh_logits, load, moe_ffn, rms_norm, rope_neox, softmax
from models import tiny_model
from test_hybrid_reference import check_logits, normalised_error

from vkrt.errors import GGUFError
from vkrt.memory import F32
from vkrt.model.arch import MOE, QKNorm, RopeKind
from vkrt.model.loader import Model

TOKENS = [3, 17, 42, 5, 99, 120, 7, 64, 11, 200, 31, 8, 77, 150, 2, 45]
PREFILL = 12
TIGHT = 1e-4     # normalised error per position, F32 KV cache
F16_KV = 1e-2    # the default F16 KV cache


def attention(cfg, w, il, q, k, v, kq_scale):
    """Causal GQA attention of q [T, H, D], k and v [T, KV, D] (scores q k^T * kq_scale), through
    attn_output."""
    T, H, KV, D = q.shape[0], cfg.n_head, cfg.n_head_kv, cfg.head_dim_v
    causal = np.tril(np.ones((T, T), bool))
    att = np.zeros((T, H, D))
    for hd in range(H):
        kv = hd // (H // KV)
        att[:, hd] = softmax(np.where(causal, q[:, hd] @ k[:, kv].T * kq_scale, -np.inf)) @ v[:, kv]
    return att.reshape(T, H * D) @ w[f"blk.{il}.attn_output.weight"].T


def forward(path: str, tokens: list[int], *, per_head_norm=False, renormalise=False) -> np.ndarray:
    """float64 logits [len(tokens), vocab]; the keywords change one feature (sensitivity checks)."""
    cfg, w = load(path, hybrid=False)
    cfg = dataclasses.replace(cfg, expert_weights_norm=renormalise)
    H, KV, D, eps = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.norm_eps
    x = w["token_embd.weight"][np.asarray(tokens)]
    T = x.shape[0]
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q, k = h @ w[p + "attn_q.weight"].T, h @ w[p + "attn_k.weight"].T
        qn, kn = w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"]
        if per_head_norm:   # qwen3's: each head normalised on its own (the weight's first head's values)
            q = rms_norm(q.reshape(T, H, D), qn[:D], eps)
            k = rms_norm(k.reshape(T, KV, D), kn[:D], eps)
        else:
            q, k = rms_norm(q, qn, eps), rms_norm(k, kn, eps)
        q = rope_neox(q.reshape(T, H, D), D, cfg.rope_base)
        k = rope_neox(k.reshape(T, KV, D), D, cfg.rope_base)
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV, D)
        x = x + attention(cfg, w, il, q, k, v, 1 / np.sqrt(D))
        x = x + moe_ffn(cfg, w, il, rms_norm(x, w[p + "ffn_norm.weight"], eps))
    return rms_norm(x, w["output_norm.weight"], eps) @ w["output.weight"].T


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory):
    path = tiny_model("tiny-olmoe", tmp_path_factory.mktemp("olmoe"))
    return path, forward(path, TOKENS)


def test_config(device, olmoe):
    with Model(device, olmoe[0], progress=False) as m:
        cfg = m.cfg
        assert cfg.spec.attn.qk_norm is QKNorm.WHOLE_ROW and not cfg.expert_weights_norm
        assert cfg.spec.rope.kind is RopeKind.NEOX
        assert all(layer.ffn == MOE for layer in cfg.layers) and cfg.n_ff_expert == 32 and cfg.n_expert == 8
        assert m.weights["blk.0.attn_q_norm.weight"].ne[0] == cfg.n_head * cfg.head_dim_k


@pytest.mark.parametrize("n_cpu_moe,flash,kv_type,tol", [(0, True, F32, TIGHT), (0, False, F32, TIGHT),
                                                         (2, True, F32, TIGHT), (0, True, None, F16_KV)])
def test_logits_match_the_numpy_forward(device, olmoe, n_cpu_moe, flash, kv_type, tol):
    """A 12-token prefill (all logits), then 4 decode steps; n_cpu_moe: every layer's experts in
    host memory. kv_type None: the engine's default F16 KV cache."""
    path, ref = olmoe
    got = fresh_logits(device, path, TOKENS, PREFILL, n_cpu_moe=n_cpu_moe, flash=flash, kv_type=kv_type)
    check_logits(got, ref, tol, f"tiny-olmoe, n_cpu_moe={n_cpu_moe}, flash={flash}, kv {kv_type}")


@pytest.mark.parametrize("change", ["per_head_norm", "renormalise"])
def test_the_reference_is_sensitive(olmoe, change):
    path, ref = olmoe
    worst = normalised_error(forward(path, TOKENS, **{change: True}), ref).max()
    assert worst > 10 * F16_KV, f"{change} changes the logits by {worst:.2e} only"


def rewrite(src: str, out, arch: str, drop_tensor: str = "", drop_key: str = "") -> str:
    """A copy of the GGUF `src` without one tensor or one metadata key."""
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name not in ("general.architecture", drop_key):
            w.add_key_value(field.name, field.contents(), field.types[0],
                            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if t.name != drop_tensor:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(out)


def assert_missing_tensor_named(device, src: str, tmp_path, arch: str, missing: str) -> None:
    """Loading `src` without the tensor `missing` fails with a GGUFError naming it."""
    path = rewrite(src, tmp_path / "missing.gguf", arch, drop_tensor=missing)
    with pytest.raises(GGUFError, match=missing.replace(".", r"\.")):
        Model(device, path, progress=False)


@pytest.mark.parametrize("missing", ["blk.1.attn_k_norm.weight", "blk.0.ffn_up_exps.weight", "output.weight"])
def test_missing_tensors_are_named(device, olmoe, tmp_path, missing):
    assert_missing_tensor_named(device, olmoe[0], tmp_path, "olmoe", missing)


def test_per_head_norms_are_refused(olmoe):
    """A q norm the size of one head (qwen3's layout) is a shape error naming the tensor."""
    from vkrt.model.config import ModelConfig
    from vkrt.model.gguf_file import GGUFFile
    from vkrt.model.tensors import check_tensors
    with GGUFFile(olmoe[0], progress=False) as f:
        meta, tensors = dict(f.metadata), f.tensors
    cfg = ModelConfig.from_metadata(meta, "m.gguf")
    norm = tensors["blk.0.attn_q_norm.weight"]
    with pytest.raises(GGUFError, match=r"blk\.0\.attn_q_norm\.weight has shape \[16\], expected \[64\]"):
        check_tensors(cfg, {**tensors, norm.name: dataclasses.replace(norm, ne=(16,))}, "m.gguf")


def test_names_are_the_converters(olmoe):
    """Every tensor is one gguf-py lists for MODEL_ARCH.OLMOE; the experts' size is in
    feed_forward_length, where llama.cpp reads it."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
    reader = gguf.GGUFReader(olmoe[0])
    names = {TENSOR_NAMES[t].format(bid=il) + ".weight" for t in MODEL_TENSORS[MODEL_ARCH.OLMOE] for il in range(2)}
    assert {t.name for t in reader.tensors} == names
    assert reader.fields["olmoe.feed_forward_length"].contents() == 32
    assert "olmoe.expert_feed_forward_length" not in reader.fields

