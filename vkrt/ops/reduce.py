"""How a row's sum is cut among a workgroup's invocations (shaders/reduce.glsl): the layout every
kernel that must sum as rms_norm does takes (rms_norm, norm_rope, mul_mv's NORM_IN)."""

from __future__ import annotations

MIN_NORM_WG = 64   # the smallest workgroup norm_wg gives


def reduce_defines(dev) -> dict[str, int]:
    """How shaders/reduce.glsl sums a workgroup on this device: a butterfly of shuffles a subgroup
    where the device shuffles (an order another kernel can redo: mul_mv's NORM_IN), else
    subgroupAdd, else a tree."""
    prof = dev.profile
    # full subgroups only: a butterfly must not read a lane past the workgroup
    if prof.subgroup_shuffle and prof.subgroup_max <= min(MIN_NORM_WG, dev.tuning.reduce_wg):
        return {"SG_BUTTERFLY": 1}
    return {"SG_REDUCE": 1} if prof.subgroup_arithmetic else {}


def norm_wg(dev, ncols: int) -> int:
    """Invocations of a workgroup that normalises rows of `ncols` (rms_norm, norm_rope: the same,
    so their sums agree): tuning.reduce_wg, halved (down to 64) while two columns an invocation
    still cover the row."""
    wg = dev.tuning.reduce_wg
    while wg // 2 >= MIN_NORM_WG and wg >= ncols:
        wg //= 2
    return wg


def butterfly_subgroups(dev, ncols: int) -> int | None:
    """The subgroups of rms_norm's workgroup for rows of `ncols` where another kernel can redo its
    sums bit for bit (SG_BUTTERFLY and one fixed subgroup size, which both kernels then have);
    None elsewhere."""
    prof = dev.profile
    if "SG_BUTTERFLY" not in reduce_defines(dev) or prof.subgroup_min != prof.subgroup_max or prof.subgroup_min < 1:
        return None
    wg = norm_wg(dev, ncols)
    return wg // prof.subgroup_min if wg % prof.subgroup_min == 0 else None
