"""Decode's mat-vec kernels: the entry shaders (shaders/mul_mv*.comp, one an epilogue each), the
features each takes (ENTRIES, the legal combinations), and the layout of a kernel's workgroup
for a weight type, K and the device (lanes a row, rows a group, how the lanes' sums meet)."""

from __future__ import annotations

from ..errors import ConfigError
from ..pipeline import PushConstants, kernel
from .grid import ceil_div, grid
from .quant import type_defines
from .reduce import butterfly_subgroups, norm_wg, subgroup_defines

# The entry shaders (shaders/<name>.comp) and the features each takes: every legal combination
# (tests/ops/test_mat_vec_entries.py compiles each). mul_mv: y = W·x over token columns;
# mul_mv_id: mul_mat_id's (token, slot) pairs, W a stack of experts; mul_mv_route: the MoE
# router, routing its tokens in its last workgroup (`route`: RouteEpilogue's defines);
# mul_mv_id_sum: the expert down projection summed over a token's `slots`, added into the
# residual stream, the next RMS norm in its last workgroup. Features: gate_up (act(W·x) * (W2·x)),
# bias (each expert's bias added to its rows), norm_in (the residual add and RMS norm first).
ENTRIES = {
    "mul_mv": frozenset({"gate_up"}),
    "mul_mv_id": frozenset({"gate_up", "bias"}),
    "mul_mv_route": frozenset({"norm_in"}),
    "mul_mv_id_sum": frozenset(),
}
EXPERT_ENTRIES = ("mul_mv_id", "mul_mv_id_sum")   # one column: workgroup z is a pair or a token

_COMMON = (("K", "u32"), ("M", "u32"), ("w_off", "u32"), ("w_row", "u32"), ("x_off", "u32"), ("x_col", "u32"),
           ("y_off", "u32"), ("y_col", "u32"))
_EXPERTS = (("w_expert", "u32"), ("e0", "u32"), ("e1", "u32"), ("n_used", "u32"), ("ids_off", "u32"),
            ("ids_tok", "u32"), ("x_slot", "u32"), ("x_slots", "u32"), ("y_slot", "u32"))
# mul_mv_route: moe_route's fields after the mat-vec's; with norm_in the add and norm's after those
ROUTE_FIELDS = ("n_used", "ids_off", "rw_off", "mode", "b_off", "count_off")
NORM_FIELDS = (("n_x_off", "u32"), ("n_x_col", "u32"), ("n_r_off", "u32"), ("n_w_off", "u32"), ("n_s_off", "u32"),
               ("n_o_off", "u32"), ("n_o_col", "u32"), ("n_eps", "f32"))
# mul_mv_id_sum: the routing weights, then the norm of the stream
SUM_FIELDS = (("wt_off", "u32"), ("count_off", "u32"), ("n_w_off", "u32"), ("n_o_off", "u32"), ("n_o_col", "u32"),
              ("n_eps", "f32"))

GLU_ACTS = {"silu": 0, "gelu": 1, "swiglu_oai": 3}   # shaders/act.glsl

# types whose mat-vec units load 16 bytes at once where blocks are 16-byte aligned (QWIDE_OK)
MV_WIDE = ("Q4_K", "Q5_K")
# units a block of each type in the mat-vec (QU in shaders/quant/<type>.glsl; unset: one per run)
MV_UNITS = {"Q2_K": 4, "Q3_K": 4, "Q4_K": 8, "Q5_K": 8, "Q6_K": 8, "Q4_0": 4, "Q4_1": 4, "Q5_0": 4, "Q5_1": 4,
            "Q8_0": 4, "IQ4_NL": 4, "IQ4_XS": 16, "IQ3_XXS": 16, "IQ3_S": 16, "IQ2_XXS": 16, "IQ2_XS": 16,
            "IQ2_S": 16, "IQ1_S": 16, "IQ1_M": 16, "MXFP4": 4, "TQ1_0": 16, "TQ2_0": 4}


def mat_vec_columns(tuning) -> int:
    """Columns (tokens) one dense mat-vec run takes: more run in several."""
    return min(tuning.mv_max_n, tuning.mv_dense_max_n)


def mat_vec_most(tuning) -> int:
    """The most columns (tokens) a dense matmul takes as mat-vec runs rather than the GEMM."""
    return max(mat_vec_columns(tuning), tuning.mv_chunk_n)


def mat_vec_units(typ, k: int) -> int:
    """Units (the pieces a lane takes at a time) in a row of k elements of `typ`."""
    if typ.quantized:
        return (k // typ.block_size) * MV_UNITS.get(typ.name, 1)
    return k // 4 + (k % 4 > 0)


def mat_vec_lanes(typ, k: int, wg: int) -> int:
    """Lanes a row (TPR) for rows of k elements of `typ`: enough for every unit of a row, a power
    of two, at most the workgroup."""
    units = mat_vec_units(typ, k)
    lanes = 1
    while lanes < min(units, wg):
        lanes *= 2
    return lanes


def mat_vec_reduce(prof, lanes: int, wg: int) -> str:
    """How a mat-vec workgroup of `wg` invocations sums a row's `lanes` partial sums
    (shaders/mv_reduce.glsl): "cluster" (a butterfly of shuffles within a subgroup), "subgroup"
    (a group is the workgroup, or whole subgroups of one fixed size: subgroup adds, then shared
    memory) or "tree" (shared memory, a barrier a halving). NVIDIA's K-quant rows of 2048 (64
    lanes, two groups a workgroup) went to the tree before whole subgroups took subgroup adds:
    H100, bench/matmul.py, 4 columns, 2048x248320 Q4_K 681 -> 288 us, Q6_K 796 -> 418,
    2048x8192 Q4_K 28.4 -> 15.5, Q6_K 31.8 -> 19.4 (one column unchanged)."""
    if prof.subgroup_shuffle and lanes <= prof.subgroup_min and wg % prof.subgroup_max == 0:
        return "cluster"
    whole = prof.subgroup_min == prof.subgroup_max and lanes % prof.subgroup_max == 0
    if prof.subgroup_arithmetic and (lanes == wg or whole):
        return "subgroup"
    return "tree"


def slots_at_once(prof, lanes: int, wg: int) -> bool:
    """Whether the summed expert projection's groups take a token's slots at once: each sums as
    mul_mat_id's workgroup of `wg` does, so where that is subgroup adds over the whole workgroup
    only if a group is whole subgroups of one fixed size (else one group walks the slots)."""
    if mat_vec_reduce(prof, lanes, wg) != "subgroup":
        return True
    return prof.subgroup_min == prof.subgroup_max and lanes % prof.subgroup_max == 0


def mat_vec_wg(tuning, experts: bool = False) -> int:
    """Invocations a mat-vec workgroup (the experts' entries: mv_id_wg where set)."""
    return tuning.mv_id_wg if experts and tuning.mv_id_wg else tuning.mv_wg


def norm_layout(device, k: int, n: int, wg: int) -> dict | None:
    """The defines of the mat-vec's RMS norm (shaders/mv_norm.glsl) for rows of k elements and n
    columns: each subgroup of the mat-vec's workgroup of `wg` (NORM_SUB of them, all of the norm's
    size NORM_SG) takes NORM_G of rms_norm's NORM_VSG subgroups, each lane NORM_E elements of
    each; None where the mat-vec cannot redo rms_norm's sums (butterfly_subgroups), its subgroups
    do not split the norm's evenly, a lane would hold over tuning.mv_norm_max_held values or the normed
    columns would not fit shared memory."""
    sg, subgroups = device.profile.subgroup_min, butterfly_subgroups(device, k)
    if subgroups is None or wg % sg or subgroups % (wg // sg):
        return None
    if 4 * n * (k + subgroups) + 8192 > device.profile.shared_memory:   # 8 KiB: the mat-vec's and routing's own
        return None
    norm = norm_wg(device, k)
    per, e = subgroups // (wg // sg), ceil_div(k, norm)
    if n * per * e > device.tuning.mv_norm_max_held:
        return None
    return {"NORM_WG": norm, "NORM_VSG": subgroups, "NORM_SG": sg, "NORM_SUB": wg // sg, "NORM_G": per,
            "NORM_E": e, "NORM_XN4": n * k // 4}


class MatVec:
    """A mat-vec pipeline and the rows a workgroup of it computes (rows a group of mat_vec_lanes
    lanes, mv_wg / lanes groups)."""

    def __init__(self, kern, rows: int):
        self.kernel, self.rows = kern, rows

    def groups(self, m: int, device, z: int = 1) -> tuple[int, int, int]:
        """The workgroup grid for m rows (x and y: the row groups; z: as given)."""
        return grid(device, ceil_div(m, self.rows), z)


def wide_ok(typ, *byte_offsets: int) -> bool:
    """Whether a mat-vec over `typ` with these weight offsets and strides can load 16 bytes at once."""
    return typ.name in MV_WIDE and all(b % 16 == 0 for b in byte_offsets)


def fewer_lanes(device, typ, tuning, *, k: int, m: int, wg: int) -> int:
    """The dense mat-vec's workgroup under tuning.mv_lanes_threads: `wg` (one row's lanes) halved
    while it is whole subgroups, a row's lanes fill it, and m / mv_rows rows at half the lanes
    still make that many invocations. Of the matrix alone: every column count gets the same."""
    groups = ceil_div(m, tuning.mv_rows)
    while (wg // 2 >= device.profile.subgroup_max and mat_vec_lanes(typ, k, wg) == wg
           and groups * (wg // 2) >= tuning.mv_lanes_threads):
        wg //= 2
    return wg


def mat_vec_shape(device, typ, n: int, tuning, *, k: int, m: int, entry: str = "mul_mv", gate_up: bool = False,
                  slots: int = 0, layers: int = 1) -> tuple[int, int, int]:
    """(invocations a workgroup, lanes a row, rows a group) of mat_vec_kernel's pipeline for these
    arguments (see there): a workgroup computes rows * (invocations // lanes) rows, or with
    mul_mv_id_sum (`slots` a token) `rows` rows, its groups a slot each (as many as the device's
    workgroup holds; more slots are walked in turn)."""
    wg = mat_vec_wg(tuning, entry in EXPERT_ENTRIES)
    limit = device.profile.max_workgroup_invocations
    if wg & (wg - 1) or wg > limit:
        raise ConfigError(f"tuning mv_wg = {wg} must be a power of two within the device's workgroup limit")
    if entry == "mul_mv" and tuning.mv_lanes_threads:
        wg = fewer_lanes(device, typ, tuning, k=k, m=m, wg=wg)
    lanes = mat_vec_lanes(typ, k, wg)
    row_groups = wg // lanes   # groups of `rows` rows a workgroup (the fill rule below counts them)
    if entry == "mul_mv_id_sum" and slots_at_once(device.profile, lanes, wg):
        # a group a slot (in whole subgroups for the shuffle clusters), all on the workgroup's rows
        whole = max(1, device.profile.subgroup_max // lanes)
        at_once = min(slots, tuning.mv_sum_slots or slots, max(1, min(limit, 1024) // lanes))
        wg, row_groups = ceil_div(at_once, whole) * whole * lanes, 1
    elif entry == "mul_mv_id_sum":   # one group (subgroup adds, subgroups of varying size) walks the slots, one row
        return wg, lanes, 1   # a row a workgroup keeps more in flight (H200, GCN table: 4 rows 16% slower)
    # gate and up: two weight rows a row
    by_type = dict(tuning.mv_rows_by_type) | (dict(tuning.mv_rows_one_column_by_type) if n == 1 else {})
    base = by_type.get(typ.name, tuning.mv_rows)
    if n > 1 and tuning.mv_rows_multi:
        base = min(base, tuning.mv_rows_multi)
    rows = max(1, base // 2) if gate_up else base
    while rows > 1 and ceil_div(m, rows * row_groups) * layers < tuning.mv_fill_groups:
        rows //= 2
    return wg, lanes, rows


def _check_entry(entry: str, n: int, features: set, route, slots: int) -> None:
    """ConfigError unless ENTRIES allows `features` on `entry` and its own arguments are given."""
    if entry not in ENTRIES:
        raise ConfigError(f"mat_vec_kernel: no entry shader {entry!r}; the entries are {', '.join(ENTRIES)}")
    illegal = features - ENTRIES[entry]
    if illegal:
        takes = ", ".join(sorted(ENTRIES[entry])) or "none"
        raise ConfigError(f"mat_vec_kernel: {entry} does not take {', '.join(sorted(illegal))} (its features: {takes})")
    if (route is not None) != (entry == "mul_mv_route"):
        raise ConfigError("mat_vec_kernel: mul_mv_route, and only it, takes the routing epilogue's defines")
    if (slots > 0) != (entry == "mul_mv_id_sum"):
        raise ConfigError("mat_vec_kernel: mul_mv_id_sum, and only it, takes the slots it sums")
    if entry in EXPERT_ENTRIES and n != 1:
        raise ConfigError(f"mat_vec_kernel: {entry} computes one column a (token, slot) pair, not {n}")


def mat_vec_variant(device, typ, n: int, tuning, *, k: int, m: int, xvec4: bool, entry: str = "mul_mv",
                    gate_up: str | None = None, bias: bool = False, norm_in: bool = False, wide: bool = False,
                    route: dict | None = None, slots: int = 0, layers: int = 1) -> tuple[dict, PushConstants, int]:
    """(defines, push layout, rows a workgroup) of mat_vec_kernel's pipeline (see there)."""
    features = {f for f, on in (("gate_up", gate_up is not None), ("bias", bias), ("norm_in", norm_in)) if on}
    _check_entry(entry, n, features, route, slots)
    wg, lanes, rows = mat_vec_shape(device, typ, n, tuning, k=k, m=m, entry=entry, gate_up=gate_up is not None,
                                    slots=slots, layers=layers)
    prof = device.profile
    experts = entry in EXPERT_ENTRIES
    defines = {**type_defines(typ, tuning), **subgroup_defines(device), "WG": wg, "NR": rows, "TPR": lanes}
    if not experts:
        defines["NC"] = n
    # the summed experts' groups reduce as mul_mat_id's workgroup does (the same bits)
    reduce = mat_vec_reduce(prof, lanes, mat_vec_wg(tuning, experts=True) if slots else wg)
    if reduce == "cluster":
        defines["REDUCE_CLUSTER"] = 1
        if tuning.mv_sum_scatter and lanes > 1:   # the butterfly's bits
            defines["MV_SCATTER"] = lanes
    elif reduce == "subgroup":
        defines.update(REDUCE_SUBGROUP=1, RED_SG=max(1, wg // max(prof.subgroup_min, 1)))
        # whole subgroups only: a workgroup narrower than a subgroup leaves lanes a shuffle would read
        if tuning.mv_sum_scatter and prof.subgroup_min == prof.subgroup_max and wg % prof.subgroup_min == 0:
            defines["MV_SCATTER"] = prof.subgroup_min
    # unrolled where a lane's units are whole unrolled steps, or one step holds them all: a long
    # row with a single unit left after a lane's pairs (14336-element Q4_K: 3.5 units a lane) ran
    # slower unrolled (H200, GCN table: 40.1 vs 35.0 us; 8B decode 170 vs 179 t/s), a short one
    # (768-element Q4_0 experts: 1.5) faster (30B-A3B decode 187 vs 182). Not where a lane has
    # one unit at most: the unrolled step would never run, yet its registers count (RX 580
    # compiler: Q4_K over 4 rows 84 VGPRs and 3 waves with it)
    units = mat_vec_units(typ, k)
    if tuning.mv_unroll > 1 and units > lanes and (units % (lanes * tuning.mv_unroll) == 0
                                                   or units <= lanes * tuning.mv_unroll):
        defines["MV_UNROLL"] = tuning.mv_unroll
    if wide and tuning.mv_wide and typ.name not in tuning.mv_narrow_types:
        defines["QWIDE"] = 1
    if xvec4:
        defines["XVEC4"] = 1
    fields = _COMMON + (_EXPERTS if experts else ())
    if gate_up is not None:
        defines.update(GATE_UP=1, ACT=GLU_ACTS[gate_up])
        fields += (("w2_off", "u32"),)
    if bias:
        defines["BIAS"] = 1
        fields += (("b_off", "u32"),) + ((("b2_off", "u32"),) if gate_up else ())
    if route is not None:
        defines.update(route)
        fields += tuple((f, "u32") for f in ROUTE_FIELDS)
    if norm_in or slots:
        # the router's norm of x (k, n columns) or the summed down projection's of the stream (m)
        layout = norm_layout(device, k, n, wg) if norm_in else norm_layout(device, m, 1, wg)
        if layout is None:
            raise ConfigError(f"mat_vec_kernel: no RMS norm of rows of {k if norm_in else m} in {entry} on this device")
        defines.update(layout)
    if norm_in:
        defines["NORM_IN"] = 1
        fields += NORM_FIELDS
    if slots:
        defines["NU"] = slots
        if tuning.mv_sum_unroll:
            defines["SLOT_UNROLL"] = 1
        fields += SUM_FIELDS
    return defines, PushConstants(*fields), rows if slots else rows * (wg // lanes)


def mat_vec_kernel(device, typ, n: int, tuning, *, k: int, m: int, xvec4: bool, entry: str = "mul_mv",
                   gate_up: str | None = None, bias: bool = False, norm_in: bool = False, wide: bool = False,
                   route: dict | None = None, slots: int = 0, layers: int = 1) -> MatVec:
    """The mat-vec pipeline of entry shader `entry` (ENTRIES) for `typ`, `m` rows of `k` elements
    and `n` token columns (1 for the experts' entries); `layers` is the grid's z extent (mul_mv_id:
    the (token, slot) pairs). Features: `gate_up` (an activation), the output act(W·x) * (W2·x);
    `bias`, each expert's bias added to its rows (both W's and W2's with gate_up); `norm_in`, x
    added to a residual and normalised first (NormInput). `wide` (see wide_ok) loads 16 bytes at
    once; `route` (mul_mv_route: moe.route_epilogue's defines) routes the tokens in the last
    workgroup (RouteEpilogue); `slots` (mul_mv_id_sum: slots a token) sums the slots' outputs
    with the routing weights, as moe_combine does, adds that into y (the residual stream) and
    normalises the stream in its last workgroup (NormOutput). Rows a group are halved (down to
    one) while the grid has fewer than tuning.mv_fill_groups workgroups. A combination ENTRIES
    does not list is a ConfigError."""
    defines, push, rows = mat_vec_variant(device, typ, n, tuning, k=k, m=m, xvec4=xvec4, entry=entry,
                                          gate_up=gate_up, bias=bias, norm_in=norm_in, wide=wide, route=route,
                                          slots=slots, layers=layers)
    return MatVec(kernel(device, entry, defines=defines, push=push), rows)
