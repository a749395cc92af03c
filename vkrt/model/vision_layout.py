"""Where a Qwen-VL tower's inputs sit: patches in the merger's order (each n_merge x n_merge block
of patches consecutive, blocks in raster order, as clip.cpp's qwen3vl graph reorders them), their
2-D rotary positions, and the learned position table resized to the patch grid as ggml_interpolate
does (bilinear with antialias, PyTorch's align_corners=False)."""

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
    """[n_out, n_in] weights of one axis of ggml's antialiased bilinear resize."""
    sf = n_out / n_in
    support = max(1.0, 1.0 / sf)
    inv = 1.0 / support
    out = np.zeros((n_out, n_in))
    for i in range(n_out):
        c = (i + 0.5) / sf
        lo, hi = max(int(c - support + 0.5), 0), min(int(c + support + 0.5), n_in)
        for s in range(lo, hi):
            out[i, s] = max(1.0 - abs((s - c + 0.5) * inv), 0.0)
        total = out[i].sum()
        if total > 0:
            out[i] /= total
    return out


def resized_positions(table: np.ndarray, side: int, gh: int, gw: int) -> np.ndarray:
    """The learned positions [side * side, E] resized to a gh x gw grid, [gh * gw, E] in raster order."""
    if gh == side and gw == side:
        return table.astype(np.float64)
    grid = table.reshape(side, side, -1).astype(np.float64)
    wy, wx = _axis_weights(side, gh), _axis_weights(side, gw)
    return np.einsum("ys,xt,ste->yxe", wy, wx, grid).reshape(gh * gw, -1)
