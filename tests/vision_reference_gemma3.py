"""A float64 numpy reference of Gemma 3's vision tower and preprocessing (llama.cpp's siglip graph
with the gemma3 projector, tools/mtmd/models/siglip.cpp, and its fixed-size preprocessor), written
from the graph and clip's image tools, not from vkrt's helpers: the conv as a sum over each patch,
the 2-D average pool and the bilinear resize as explicit loops."""

from __future__ import annotations

import math

import numpy as np
from vision_reference import _ln, attend_and_mlp, tensors


def _lerp(a: np.float32, b: np.float32, t: np.float32) -> np.float32:
    return np.float32(a + (b - a) * t)


def _bilinear(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """clip's resize_bilinear as b10434 has it (the corners aligned), float32, truncated to uint8."""
    h, w = rgb.shape[:2]
    out = np.zeros((height, width, 3), np.uint8)
    xr = np.float32(w - 1) / np.float32(max(width - 1, 1))
    yr = np.float32(h - 1) / np.float32(max(height - 1, 1))
    for y in range(height):
        for x in range(width):
            px, py = np.float32(xr * np.float32(x)), np.float32(yr * np.float32(y))
            x0, y0 = min(int(px), w - 2), min(int(py), h - 2)
            tx, ty = np.float32(px - x0), np.float32(py - y0)
            for c in range(3):
                top = _lerp(np.float32(rgb[y0, x0, c]), np.float32(rgb[y0, x0 + 1, c]), tx)
                bottom = _lerp(np.float32(rgb[y0 + 1, x0, c]), np.float32(rgb[y0 + 1, x0 + 1, c]), tx)
                out[y, x, c] = np.uint8(_lerp(top, bottom, ty))
    return out


def preprocess(rgb: np.ndarray, size: int, mean, std) -> np.ndarray:
    """mtmd's fixed-size preprocessor: rgb [h, w, 3] uint8 scaled (aspect kept) into a size x size
    black square, centred, then (x / 255 - mean) / std per channel; float32 [3, size, size]."""
    h, w = rgb.shape[:2]
    square = np.zeros((size, size, 3), np.uint8)
    if (w, h) == (size, size):
        square = rgb.copy()
    else:
        s = min(np.float32(size) / np.float32(w), np.float32(size) / np.float32(h))
        nw = min(int(math.ceil(np.float32(w) * s)), size)
        nh = min(int(math.ceil(np.float32(h) * s)), size)
        ox, oy = (size - nw) // 2, (size - nh) // 2
        square[oy:oy + nh, ox:ox + nw] = _bilinear(rgb, nw, nh)
    out = np.zeros((3, size, size), np.float32)
    for c in range(3):
        out[c] = (square[:, :, c].astype(np.float32) / np.float32(255.0) - np.float32(mean[c])) / np.float32(std[c])
    return out


def encode(path: str, pixels: np.ndarray) -> np.ndarray:
    """Image tokens [n_tokens, proj_dim] of `pixels` [3, S, S] (already preprocessed)."""
    meta, t = tensors(path)
    v = "clip.vision."
    E, H, p = meta[v + "embedding_length"], meta[v + "attention.head_count"], meta[v + "patch_size"]
    k = meta.get(v + "projector.scale_factor", 4)
    eps = meta[v + "attention.layer_norm_epsilon"]
    D = E // H
    img = pixels.astype(np.float64)
    side = img.shape[1] // p
    h = np.zeros((side * side, E))
    for y in range(side):
        for x in range(side):
            h[y * side + x] = np.einsum("ecij,cij->e", t["v.patch_embd.weight"], img[:, y * p:(y + 1) * p, x * p:(x + 1) * p])
    h = h + t["v.patch_embd.bias"] + t["v.position_embd.weight"]
    n = h.shape[0]
    il = 0
    while f"v.blk.{il}.ln1.weight" in t:
        b = f"v.blk.{il}."
        cur = _ln(h, t[b + "ln1.weight"], t[b + "ln1.bias"], eps)
        q, kk, vv = ((cur @ t[b + f"attn_{m}.weight"].T + t[b + f"attn_{m}.bias"]).reshape(n, H, D) for m in "qkv")
        h = attend_and_mlp(h, q, kk, vv, t, b, eps)
        il += 1
    h = _ln(h, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)
    s = side // k
    pooled = np.zeros((s * s, E))
    for y in range(s):
        for x in range(s):
            for dy in range(k):
                for dx in range(k):
                    pooled[y * s + x] += h[(y * k + dy) * side + x * k + dx]
    pooled /= k * k
    normed = pooled / np.sqrt((pooled ** 2).mean(-1, keepdims=True) + eps) * t["mm.soft_emb_norm.weight"]
    return normed @ t["mm.input_projection.weight"]   # numpy [E, text width]: ggml's transpose of the tensor
