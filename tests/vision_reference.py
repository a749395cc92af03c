"""A float64 numpy reference of the Qwen3-VL / Qwen3.5 vision tower (llama.cpp's qwen3vl graph),
written from the graph, not from vkrt's layout helpers: the conv as a sum over each patch, the
merge as explicit loops, ggml's vision rope (two sections over the head's halves, each restarting
its frequencies), the position table resized bilinearly with aligned corners (what llama.cpp
b10434's resize_position_embeddings computes: its embeddings of tests/vision_cases.py's first
image are within 2e-3 of this reference, the antialiased resize 0.42 off)."""

from __future__ import annotations

import math

import numpy as np

from vkrt.model.gguf_file import GGUFFile


def tensors(path: str) -> tuple[dict, dict]:
    """(metadata, name -> float64 array in numpy order) of an F32/F16 mmproj file."""
    with GGUFFile(path, progress=False) as f:
        out = {n: f.data(n).view(t.type.dtype).astype(np.float64).reshape(tuple(reversed(t.ne)))
               for n, t in f.tensors.items()}
        return dict(f.metadata), out


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)))


def attend_and_mlp(h, q, kk, vv, t: dict, b: str, eps: float):
    """The rest of ViT block b after its q, k, v ([n, heads, head]): full attention, attn_out and the
    residual, then ln2, the GELU MLP and its residual."""
    n, H, D = q.shape
    att = np.einsum("nhd,mhd->hnm", q, kk) / math.sqrt(D)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    o = np.einsum("hnm,mhd->nhd", att, vv).reshape(n, H * D)
    h = h + o @ t[b + "attn_out.weight"].T + t[b + "attn_out.bias"]
    cur = _ln(h, t[b + "ln2.weight"], t[b + "ln2.bias"], eps)
    ff = _gelu(cur @ t[b + "ffn_up.weight"].T + t[b + "ffn_up.bias"])
    return h + ff @ t[b + "ffn_down.weight"].T + t[b + "ffn_down.bias"]


def _resize_axis(n_in, n_out):
    """Bilinear with aligned corners: output i reads input i * (n_in - 1) / (n_out - 1)."""
    wts = np.zeros((n_out, n_in))
    for i in range(n_out):
        c = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        lo = math.floor(c)
        hi = min(lo + 1, n_in - 1)
        wts[i, lo] += 1.0 - (c - lo)
        wts[i, hi] += c - lo
    return wts


def _rope(x, py, px, base=10000.0):
    """x [n, H, D]; pair i (with i + D/2) turns by py (i < D/4) or px, frequency restarting."""
    n, H, D = x.shape
    half, quarter = D // 2, D // 4
    out = x.copy()
    for i in range(half):
        j, p = (i, py) if i < quarter else (i - quarter, px)
        theta = p * base ** (-2.0 * j / half)
        c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
        a, b = x[:, :, i], x[:, :, i + half]
        out[:, :, i], out[:, :, i + half] = a * c - b * s, a * s + b * c
    return out


def encode(path: str, pixels: np.ndarray) -> np.ndarray:
    """Image tokens [n_tokens, proj_dim] of `pixels` [3, H, W] (already preprocessed)."""
    meta, t = tensors(path)
    v = "clip.vision."
    E, H, p, m = meta[v + "embedding_length"], meta[v + "attention.head_count"], meta[v + "patch_size"], \
        meta.get(v + "spatial_merge_size", 2)
    eps = meta[v + "attention.layer_norm_epsilon"]
    D = E // H
    img = pixels.astype(np.float64)
    gh, gw = img.shape[1] // p, img.shape[2] // p
    k = t["v.patch_embd.weight"] + t["v.patch_embd.weight.1"]   # [E, 3, p, p]; both see the same image
    raster = np.zeros((gh, gw, E))
    for y in range(gh):
        for x in range(gw):
            raster[y, x] = np.einsum("ecij,cij->e", k, img[:, y * p:(y + 1) * p, x * p:(x + 1) * p])
    side = int(round(math.sqrt(t["v.position_embd.weight"].shape[0])))
    grid = t["v.position_embd.weight"].reshape(side, side, E)
    pos = np.einsum("ys,xt,ste->yxe", _resize_axis(side, gh), _resize_axis(side, gw), grid)
    raster = raster + t["v.patch_embd.bias"] + pos
    seq, py, px = [], [], []
    for by in range(gh // m):
        for bx in range(gw // m):
            for dy in range(m):
                for dx in range(m):
                    yy, xx = by * m + dy, bx * m + dx
                    seq.append(raster[yy, xx])
                    py.append(yy)
                    px.append(xx)
    h = np.array(seq)
    py, px = np.array(py, np.float64), np.array(px, np.float64)
    n = h.shape[0]
    il = 0
    while f"v.blk.{il}.ln1.weight" in t:
        b = f"v.blk.{il}."
        cur = _ln(h, t[b + "ln1.weight"], t[b + "ln1.bias"], eps)
        qkv = cur @ t[b + "attn_qkv.weight"].T + t[b + "attn_qkv.bias"]
        q, kk, vv = (qkv[:, i * E:(i + 1) * E].reshape(n, H, D) for i in range(3))
        q, kk = _rope(q, py, px), _rope(kk, py, px)
        h = attend_and_mlp(h, q, kk, vv, t, b, eps)
        il += 1
    if "v.post_ln.weight" in t:
        h = _ln(h, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)
    merged = h.reshape(n // (m * m), m * m * E)
    mid = _gelu(merged @ t["mm.0.weight"].T + t["mm.0.bias"])
    return mid @ t["mm.2.weight"].T + t["mm.2.bias"]
