"""How a row's sum is cut among a workgroup's invocations (shaders/reduce.glsl): the layout every
kernel that must sum as rms_norm does takes (rms_norm, norm_rope, the mat-vec's norms); and the
subgroups the kernels are laid out for (shaders/subgroup.glsl)."""

from __future__ import annotations

MIN_NORM_WG = 64   # the smallest workgroup norm_wg gives


def subgroup_defines(dev) -> dict[str, int]:
    """SG_LOGICAL (shaders/subgroup.glsl emulates subgroups of that many lanes) where the device's
    profile lays kernels out for wider subgroups than the device runs: subgroup_min above the
    subgroup size the device reports, a profile only a test gives (lavapipe's 8 lanes running the
    RX 580's 64-lane layouts, tests/conftest.py wave64). Empty for every device as it reports
    itself. The kernels that take it: the mat-vec entries, rms_norm, norm_rope, moe_route, the
    delta rule's recurrent form and flash attention's norm_rope prologue."""
    prof = dev.profile
    return {"SG_LOGICAL": prof.subgroup_min} if prof.subgroup_min > prof.subgroup_size else {}


def reduce_defines(dev) -> dict[str, int]:
    """How shaders/reduce.glsl sums a workgroup on this device: a butterfly of shuffles a subgroup
    where the device shuffles (an order another kernel can redo: the mat-vec's norms), else
    subgroupAdd, else a tree."""
    prof = dev.profile
    # full subgroups only: a butterfly must not read a lane past the workgroup
    if prof.subgroup_shuffle and prof.subgroup_max <= min(MIN_NORM_WG, dev.tuning.reduce_wg):
        return {"SG_BUTTERFLY": 1, **subgroup_defines(dev)}
    return {"SG_REDUCE": 1, **subgroup_defines(dev)} if prof.subgroup_arithmetic else {}


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
