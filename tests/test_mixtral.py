"""Mixtral-style MoE stored as arch `llama` (routed experts when `llama.expert_count` > 0, as
llama.cpp's llama graph: softmax routing, top-k, the chosen weights renormalised): the tiny model
against a float64 numpy forward pass, prefill and decode, experts in VRAM and on the host."""

import dataclasses

import numpy as np
import pytest
from hybrid_reference import glu_ffn, load, moe_ffn, prompt_then_decode, rms_norm, softmax
from models import tiny_model
from test_hybrid_reference import check_logits

from vkrt.engine.engine import Engine
from vkrt.model.arch import DENSE, MOE
from vkrt.model.loader import Model

TOKENS = [3, 17, 42, 5, 99, 120, 7, 64, 11, 200, 31, 8, 77, 150, 2, 45, 19, 230, 6, 88]


def rope_normal(x, base: float):
    """GGML's normal RoPE at positions 0..T-1 on x [T, H, Dh]: pairs (x[2i], x[2i+1])."""
    T, D = x.shape[0], x.shape[-1]
    theta = np.arange(T)[:, None] * base ** (-2.0 * np.arange(D // 2) / D)
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def forward(path: str, tokens: list[int]) -> np.ndarray:
    """float64 logits [len(tokens), vocab] of a llama GGUF (dense or routed FFNs; the routing
    weights renormalised over the chosen experts, as llama.cpp's llama graph, whatever vkrt's
    config says)."""
    cfg, w = load(path, hybrid=False)
    cfg = dataclasses.replace(cfg, expert_weights_norm=True)
    H, KV, Dh, eps = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.norm_eps
    x = w["token_embd.weight"][np.asarray(tokens)]
    T = x.shape[0]
    causal = np.tril(np.ones((T, T), bool))
    for il, layer in enumerate(cfg.layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = rope_normal((h @ w[p + "attn_q.weight"].T).reshape(T, H, Dh), cfg.rope_base)
        k = rope_normal((h @ w[p + "attn_k.weight"].T).reshape(T, KV, Dh), cfg.rope_base)
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV, Dh)
        att = np.zeros((T, H, Dh))
        for hd in range(H):
            kv = hd // (H // KV)
            att[:, hd] = softmax(np.where(causal, q[:, hd] @ k[:, kv].T / np.sqrt(Dh), -np.inf)) @ v[:, kv]
        x = x + att.reshape(T, H * Dh) @ w[p + "attn_output.weight"].T
        h2 = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        if layer.ffn == DENSE:
            x = x + glu_ffn(h2, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"])
        else:
            x = x + moe_ffn(cfg, w, il, h2)
    return rms_norm(x, w["output_norm.weight"], eps) @ w.get("output.weight", w["token_embd.weight"]).T


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    path = tiny_model("tiny-mixtral", tmp_path_factory.mktemp("mixtral"))
    return path, forward(path, TOKENS)


def test_llama_with_experts_is_a_moe(device, mixtral):
    with Model(device, mixtral[0], progress=False) as m:
        assert m.cfg.arch == "llama" and m.cfg.n_expert == 4 and m.cfg.n_expert_used == 2
        assert m.cfg.expert_weights_norm and all(layer.ffn == MOE for layer in m.cfg.layers)
    with Model(device, tiny_model("tiny-llama", mixtral[0].rsplit("/", 1)[0]), progress=False) as m:
        assert m.cfg.n_expert == 0 and all(layer.ffn == DENSE for layer in m.cfg.layers)


@pytest.mark.parametrize("n_cpu_moe", [0, 2])
def test_logits_match_the_numpy_forward(device, mixtral, n_cpu_moe):
    """Prefill of 12 tokens (all logits), then 8 decode steps, against the float64 reference;
    with n_cpu_moe the experts are read from host memory."""
    path, ref = mixtral
    with Model(device, path, progress=False, n_cpu_moe=n_cpu_moe) as m, Engine(m, n_ctx=128, n_ubatch=64) as e:
        got = prompt_then_decode(e, TOKENS, 12)
    check_logits(got, ref, 2e-3, f"tiny-mixtral, n_cpu_moe={n_cpu_moe}")


def test_experts_stored_apart_ask_for_a_new_conversion(device, mixtral, tmp_path):
    """An old Mixtral conversion (blk.N.ffn_gate.E.weight, one tensor an expert): a clear error
    that says to convert again, not a list of missing stacks."""
    import gguf

    from vkrt.errors import GGUFError
    reader = gguf.GGUFReader(mixtral[0])
    out = tmp_path / "split.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            w.add_key_value(field.name, field.contents(), field.types[0],
                            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if "_exps." in t.name:
            for e in range(t.data.shape[0]):
                w.add_tensor(t.name.replace("_exps.", f".{e}."), np.ascontiguousarray(t.data[e]),
                             raw_dtype=t.tensor_type)
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match=r"blk\.0\.ffn_down\.0\.weight, \.\.\.: an old Mixtral conversion\); convert"):
        Model(device, str(out), progress=False)
