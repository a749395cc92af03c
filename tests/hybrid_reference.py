"""A float64 numpy forward pass of Qwen3.5 / Qwen3.6 / Qwen3-Next GGUF models (`qwen35`,
`qwen35moe`, `qwen3next`) as llama.cpp's graph computes it: the test oracle for vkrt's hybrid
models. Clarity over speed (tiny models only): one fresh sequence, every token at once, positions
0..T-1.

qwen3next differs from qwen35moe only in its DeltaNet tensors (llama.cpp's src/models/qwen3next.cpp):
the input projection is ssm_in, per key head g [q_g, k_g, v and z of value heads g*rep..] (or, from
newer converters, attn_qkv / attn_gate as qwen35's), beta and alpha come from one ssm_ba, per key
head g [beta of its rep value heads, their alpha], and value head j reads key head j // rep
(q and k repeated interleaved; qwen35's are tiled: j % Hk); and in its RoPE: NEOX over
rope.dimension_count dims (qwen35: IMROPE sections, the same rotation for text positions).

    x = token_embd[tokens]
    per layer: x += gated_delta_net(rms_norm(x))  or  gated_attention(rms_norm(x))
               x += ffn(rms_norm(x))               (dense, or routed experts + gated shared expert)
    logits = output @ rms_norm(x)

Arrays are in numpy order (the reverse of ggml's ne): activations [T, n], a matrix with ne
(in, out) is [out, in] and y = x @ W.T, expert stacks are [n_expert, out, in].
"""

from __future__ import annotations

import numpy as np
import gguf
from gguf.quants import dequantize

from vkrt.model.arch import DENSE, LINEAR, MOE_SHARED, DeltaNet
from vkrt.model.config import ModelConfig


def load(path: str, hybrid: bool = True) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """The model's config and every tensor, dequantised to float64 in numpy order."""
    reader = gguf.GGUFReader(path)
    meta = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    cfg = ModelConfig.from_metadata(meta, path)
    if hybrid and cfg.spec.layers.delta_net is DeltaNet.NONE:
        raise ValueError(f"{path}: {cfg.arch} is not a qwen35 / qwen35moe / qwen3next model")
    weights = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        weights[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return cfg, weights


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rms_norm(v, w, eps):
    """Over the last axis: v / sqrt(mean(v^2) + eps) * w."""
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * w


def l2_normalize(v, eps):
    """Over the last axis: v / max(||v||, eps) (ggml_l2_norm)."""
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), eps)


def causal_conv(x, w):
    """Depthwise causal conv of a fresh sequence: x [T, C], w [C, K];
    y[t, c] = sum_k w[c, k] * x[t - (K - 1) + k, c], with x = 0 before the first token."""
    T, K = x.shape[0], w.shape[1]
    padded = np.concatenate([np.zeros((K - 1, x.shape[1])), x])
    return sum(w[:, k] * padded[k:k + T] for k in range(K))


def key_head_of(n_v_heads: int, n_k_heads: int, interleaved: bool = False) -> np.ndarray:
    """The q/k head each value head reads: qwen35's q/k heads are tiled (ggml_repeat),
    qwen3next's interleaved (reshaped to [D, 1, Hk], repeated to [D, rep, Hk])."""
    if interleaved:
        return np.arange(n_v_heads) // (n_v_heads // n_k_heads)
    return np.arange(n_v_heads) % n_k_heads


def grouped(cfg: ModelConfig) -> bool:
    """qwen3next's DeltaNet tensors (grouped by key head)."""
    return cfg.spec.layers.delta_net is DeltaNet.GROUPED


def delta_net_inputs(cfg: ModelConfig, w: dict, il: int, h):
    """(qkv [T, conv channels], z [T, Hv, D], alpha, beta [T, Hv]) of a DeltaNet block."""
    D, Hk, Hv, p = cfg.ssm_head_dim, cfg.ssm_k_heads, cfg.ssm_v_heads, f"blk.{il}."
    T, rep = h.shape[0], Hv // Hk
    if not grouped(cfg):
        return (h @ w[p + "attn_qkv.weight"].T, (h @ w[p + "attn_gate.weight"].T).reshape(T, Hv, D),
                h @ w[p + "ssm_alpha.weight"].T, h @ w[p + "ssm_beta.weight"].T)
    if p + "ssm_in.weight" in w:   # per key head: q, k, rep value heads, their rep z
        m = (h @ w[p + "ssm_in.weight"].T).reshape(T, Hk, 2 * D + 2 * rep * D)
        qkv = np.concatenate([m[..., :D].reshape(T, -1), m[..., D:2 * D].reshape(T, -1),
                              m[..., 2 * D:2 * D + rep * D].reshape(T, -1)], axis=1)
        z = m[..., 2 * D + rep * D:].reshape(T, Hv, D)
    else:
        qkv, z = h @ w[p + "attn_qkv.weight"].T, (h @ w[p + "attn_gate.weight"].T).reshape(T, Hv, D)
    ba = (h @ w[p + "ssm_ba.weight"].T).reshape(T, Hk, 2 * rep)
    return qkv, z, ba[..., rep:].reshape(T, Hv), ba[..., :rep].reshape(T, Hv)


def delta_rule(q, k, v, g, b):
    """The gated delta rule from a zero state: q, k, v [T, Hv, D], g (log-decay) and b (write
    strength) [T, Hv]. Per head, S [D, D] (rows: value dims, columns: key dims):
    S = e^g S;  u = b (v - S k);  S += u k^T;  o = S q.  Returns o [T, Hv, D]."""
    T, Hv, D = v.shape
    S = np.zeros((Hv, D, D))
    out = np.zeros((T, Hv, D))
    for t in range(T):
        S *= np.exp(g[t])[:, None, None]
        u = b[t][:, None] * (v[t] - np.einsum("hij,hj->hi", S, k[t]))
        S += np.einsum("hi,hj->hij", u, k[t])
        out[t] = np.einsum("hij,hj->hi", S, q[t])
    return out


def gated_delta_net(cfg: ModelConfig, w: dict, il: int, h, interleaved: bool | None = None):
    """A linear-attention (Gated DeltaNet) block on h [T, n_embd]; `interleaved` overrides how
    value heads pair with key heads (default: the architecture's)."""
    D, Hk, Hv, eps, p = cfg.ssm_head_dim, cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.norm_eps, f"blk.{il}."
    T = h.shape[0]
    qkv, z, alpha, beta = delta_net_inputs(cfg, w, il, h)
    y = silu(causal_conv(qkv, w[p + "ssm_conv1d.weight"]))
    q = y[:, :Hk * D].reshape(T, Hk, D)
    k = y[:, Hk * D:2 * Hk * D].reshape(T, Hk, D)
    v = y[:, 2 * Hk * D:].reshape(T, Hv, D)
    kh = key_head_of(Hv, Hk, grouped(cfg) if interleaved is None else interleaved)
    q = l2_normalize(q, eps)[:, kh] / np.sqrt(D)
    k = l2_normalize(k, eps)[:, kh]
    g = softplus(alpha + w[p + "ssm_dt.bias"]) * w[p + "ssm_a"]
    o = delta_rule(q, k, v, g, sigmoid(beta))
    o = rms_norm(o, w[p + "ssm_norm.weight"], eps) * silu(z)
    return o.reshape(T, Hv * D) @ w[p + "ssm_out.weight"].T


def rope_neox(x, n_dims: int, base: float):
    """NEOX RoPE of the first n_dims of each head at positions 0..T-1: x [T, H, Dh]; pair i
    (i < n_dims / 2) is (x[i], x[i + n_dims / 2]), rotated by pos * base^(-2i / n_dims)."""
    T, half = x.shape[0], n_dims // 2
    theta = np.arange(T)[:, None] * base ** (-2.0 * np.arange(half) / n_dims)   # [T, half]
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
    a, b = x[..., :half], x[..., half:n_dims]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, x[..., n_dims:]], axis=-1)


def gated_attention(cfg: ModelConfig, w: dict, il: int, h):
    """A full-attention block with qwen35's per-head output gate on h [T, n_embd]."""
    H, KV, Dh, eps, p = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.norm_eps, f"blk.{il}."
    T = h.shape[0]
    qg = (h @ w[p + "attn_q.weight"].T).reshape(T, H, 2 * Dh)
    query, gate = qg[..., :Dh], qg[..., Dh:]
    k = (h @ w[p + "attn_k.weight"].T).reshape(T, KV, Dh)
    v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV, Dh)
    # IMROPE with every text position stream equal rotates exactly like NEOX
    q = rope_neox(rms_norm(query, w[p + "attn_q_norm.weight"], eps), cfg.rope_dims, cfg.rope_base)
    k = rope_neox(rms_norm(k, w[p + "attn_k_norm.weight"], eps), cfg.rope_dims, cfg.rope_base)
    kv_head = np.arange(H) // (H // KV)
    causal = np.tril(np.ones((T, T), bool))
    att = np.zeros((T, H, Dh))
    for hd in range(H):
        scores = q[:, hd] @ k[:, kv_head[hd]].T / np.sqrt(Dh)
        att[:, hd] = softmax(np.where(causal, scores, -np.inf)) @ v[:, kv_head[hd]]
    att = att * sigmoid(gate)
    return att.reshape(T, H * Dh) @ w[p + "attn_output.weight"].T


def glu_ffn(x, gate, up, down):
    """down @ (silu(gate @ x) * (up @ x)) for x [T, n]."""
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T


def routed_sum(cfg: ModelConfig, w: dict, il: int, x, select, weigh):
    """Each token's n_expert_used experts with the best `select` scores [T, n_expert] (ties: the
    lower id), summed with weigh(t, top) as their weights, on x [T, n_embd]."""
    p = f"blk.{il}."
    gates, ups, downs = (w[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-select[t], kind="stable")[:cfg.n_expert_used]
        for e, we in zip(top, weigh(t, top)):
            out[t] += we * glu_ffn(x[t:t + 1], gates[e], ups[e], downs[e])[0]
    return out


def moe_ffn(cfg: ModelConfig, w: dict, il: int, x):
    """Routed experts (softmax, top-k, weights renormalised over the chosen) plus the
    sigmoid-gated shared expert, on x [T, n_embd]."""
    p = f"blk.{il}."
    probs = softmax(x @ w[p + "ffn_gate_inp.weight"].T)

    def weigh(t, top):
        weights = probs[t, top]
        return weights / weights.sum() if cfg.expert_weights_norm else weights

    out = routed_sum(cfg, w, il, x, probs, weigh)
    if cfg.layers[il].ffn == MOE_SHARED:
        shared = glu_ffn(x, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"],
                         w[p + "ffn_down_shexp.weight"])
        out += shared * sigmoid(x @ w[p + "ffn_gate_inp_shexp.weight"])[:, None]
    return out


def blocks(cfg: ModelConfig, w: dict, x, interleaved: bool | None = None):
    """The residual stream x [T, n_embd] through every layer of `cfg`."""
    eps = cfg.norm_eps
    for il, layer in enumerate(cfg.layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        x = x + (gated_delta_net(cfg, w, il, h, interleaved) if layer.attn == LINEAR
                 else gated_attention(cfg, w, il, h))
        h2 = rms_norm(x, w[p + "post_attention_norm.weight"], eps)
        if layer.ffn == DENSE:
            x = x + glu_ffn(h2, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"])
        else:
            x = x + moe_ffn(cfg, w, il, h2)
    return x


def forward(path: str, tokens: list[int], interleaved: bool | None = None) -> np.ndarray:
    """float64 logits [len(tokens), vocab] of a qwen35 / qwen35moe / qwen3next GGUF for a fresh
    sequence (`interleaved`: see gated_delta_net)."""
    cfg, w = load(path)
    x = blocks(cfg, w, w["token_embd.weight"][np.asarray(tokens)], interleaved)
    output = w.get("output.weight", w["token_embd.weight"])
    return rms_norm(x, w["output_norm.weight"], cfg.norm_eps) @ output.T


def mtp_forward(path: str, tokens: list[int]) -> np.ndarray:
    """float64 logits [len(tokens) - 1, vocab] of the file's first MTP block (vkrt/model/mtp.py)
    at positions 0..T-2 of a fresh sequence: position p reads the trunk's normed final state
    h_p and the embedding of tokens[p + 1]."""
    from vkrt.model.mtp import mtp_config
    cfg, w = load(path)
    eps, L, embd = cfg.norm_eps, cfg.n_layer, w["token_embd.weight"]
    output = w.get("output.weight", embd)
    h = rms_norm(blocks(cfg, w, embd[np.asarray(tokens)]), w["output_norm.weight"], eps)[:-1]
    head = {k.replace(f"blk.{L}.", "blk.0.", 1): v for k, v in w.items() if k.startswith(f"blk.{L}.")}
    e = rms_norm(embd[np.asarray(tokens[1:])], head["blk.0.nextn.enorm.weight"], eps)
    z = np.concatenate([e, rms_norm(h, head["blk.0.nextn.hnorm.weight"], eps)], axis=1)
    z = blocks(mtp_config(cfg), head, z @ head["blk.0.nextn.eh_proj.weight"].T)
    return rms_norm(z, head.get("blk.0.nextn.shared_head_norm.weight", w["output_norm.weight"]), eps) @ output.T


def prompt_then_decode(engine, tokens, prefill: int) -> np.ndarray:
    """The engine's logits at every position of tokens[:prefill] (one prompt), then one decode
    step a token for the rest."""
    rows = [engine.eval(tokens[:prefill], all_logits=True)]
    rows += [engine.eval([t])[None] for t in tokens[prefill:]]
    return np.concatenate(rows)


def fresh_logits(device, path: str, tokens, prefill: int, *, n_cpu_moe: int = 0, flash: bool = True, kv_type=None,
                 **model_kw) -> np.ndarray:
    """prompt_then_decode's logits of a newly opened model and engine (64-token context, 32-token
    ubatches); kv_type None: the engine's default F16 KV cache."""
    from vkrt.engine.engine import Engine
    from vkrt.model.loader import Model
    kw = {"kv_type": kv_type} if kv_type else {}
    with Model(device, path, progress=False, n_cpu_moe=n_cpu_moe, **model_kw) as m, \
            Engine(m, n_ctx=64, n_ubatch=32, flash_attn=flash, **kw) as e:
        return prompt_then_decode(e, tokens, prefill)
