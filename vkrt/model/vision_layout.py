"""Where a Qwen-VL tower's inputs sit: patches in the merger's order (each n_merge x n_merge block
of patches consecutive, blocks in raster order, as clip.cpp's qwen3vl graph reorders them), their
2-D rotary positions, and the learned position table resized to the patch grid as ggml_interpolate
does in tools/mtmd's resize_position_embeddings (bilinear, corners aligned: what llama.cpp b10434
computes, checked against its embeddings)."""

from __future__ import annotations

import numpy as np


def merge_order(gh: int, gw: int, merge: int) -> np.ndarray:
    """The raster index (y * gw + x) of the patch at each place of the merger's order."""
    y, x = np.mgrid[0:gh, 0:gw]
    blocks = (y.reshape(gh // merge, merge, gw // merge, merge).transpose(0, 2, 1, 3) * gw
              + x.reshape(gh // merge, merge, gw // merge, merge).transpose(0, 2, 1, 3))
    return blocks.reshape(-1)


def patch_rows(pixels: np.ndarray, patch: int, merge: int) -> np.ndarray:
    """pixels [3, H, W] as one row a patch, [n_patches, 3 * patch * patch] (column c*p*p + ky*p + kx,
    a conv weight's layout), in the merger's order."""
    c, h, w = pixels.shape
    gh, gw = h // patch, w // patch
    rows = pixels.reshape(c, gh, patch, gw, patch).transpose(1, 3, 0, 2, 4).reshape(gh * gw, c * patch * patch)
    return np.ascontiguousarray(rows[merge_order(gh, gw, merge)])


def rope_positions(gh: int, gw: int, merge: int) -> np.ndarray:
    """The rotary position streams (y, x, y, x) of the patches in the merger's order, I32 [4 * n]."""
    order = merge_order(gh, gw, merge)
    y, x = (order // gw).astype(np.int32), (order % gw).astype(np.int32)
    return np.concatenate([y, x, y, x])


def _axis_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of one axis of ggml_interpolate's bilinear resize with aligned
    corners (GGML_SCALE_FLAG_ALIGN_CORNERS: output i samples input i * (n_in - 1) / (n_out - 1))."""
    out = np.zeros((n_out, n_in))
    scale = (n_in - 1) / (n_out - 1) if n_out > 1 and n_in > 1 else n_in / n_out
    for i in range(n_out):
        c = min(max(np.float32(i) * np.float32(scale), 0.0), n_in - 1)
        lo = int(np.floor(c))
        hi, f = min(lo + 1, n_in - 1), c - lo
        out[i, lo] += 1.0 - f
        out[i, hi] += f
    return out


def resized_positions(table: np.ndarray, side: int, gh: int, gw: int) -> np.ndarray:
    """The learned positions [side * side, E] resized to a gh x gw grid, [gh * gw, E] in raster order."""
    if gh == side and gw == side:
        return table.astype(np.float64)
    grid = table.reshape(side, side, -1).astype(np.float64)
    wy, wx = _axis_weights(side, gh), _axis_weights(side, gw)
    rows = np.tensordot(wy, grid, axes=(1, 0))               # [gh, side, E]: the y axis resized
    return np.tensordot(wx, rows, axes=(1, 1)).transpose(1, 0, 2).reshape(gh * gw, -1)
