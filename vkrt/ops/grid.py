"""Workgroup grids: how a dispatch's workgroup count is laid out within the device's
maxComputeWorkGroupCount. A kernel over a 1-D index of workgroups (a row, a block of elements)
flattens its grid as y * gl_NumWorkGroups.x + x (shaders/common.glsl global_index) and skips
the ids past its count, so a count beyond the x limit folds into y."""

from __future__ import annotations

FOLD_X = 65535   # x width of a folded grid (every Vulkan device allows at least this many)


def ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def grid(device, groups: int, z: int = 1) -> tuple[int, int, int]:
    """`groups` workgroups of a 1-D index as (x, y, z): along x while the device allows, folded
    into rows of at most FOLD_X beyond; z as given (an index the kernel reads from
    gl_WorkGroupID.z)."""
    groups = max(1, groups)
    max_x = device.profile.max_workgroup_count[0]
    if groups <= max_x:
        return (groups, 1, z)
    x = min(max_x, FOLD_X)
    return (x, ceil_div(groups, x), z)


def groups_for(kernel, n: int, z: int = 1) -> tuple[int, int, int]:
    """The grid covering n invocations of `kernel` (its workgroup's x size a workgroup)."""
    return grid(kernel.device, ceil_div(n, kernel.workgroup[0]), z)
