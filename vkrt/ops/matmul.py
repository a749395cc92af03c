"""y = W·x with W of any supported weight type, x and y f32: a mat-vec kernel for a few tokens
(decode), a tiled GEMM with dequantise-on-load for many (prefill); the tuning table sets both."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ..errors import ConfigError, UnsupportedShape
from ..memory import F32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import WORD_ALIGN, bind_together, bind_words
from .flash_work import FlashWork
from .grid import ceil_div, grid
from .mat_vec import (GLU_ACTS, mat_vec_columns, mat_vec_kernel, mat_vec_most, mat_vec_shape,
                      mat_vec_wg, norm_layout, slots_at_once, wide_ok)
from .quant import check_layout, chunks, flat_rows, kernel_type, type_defines

_COMMON = (("K", "u32"), ("M", "u32"))
_OPERANDS = (("w_off", "u32"), ("w_row", "u32"), ("x_off", "u32"), ("x_col", "u32"), ("y_off", "u32"),
             ("y_col", "u32"))
MM_PUSH = PushConstants(*_COMMON, ("N", "u32"), *_OPERANDS)
MM_SPLIT_PUSH = PushConstants(*MM_PUSH.fields, ("k_split", "u32"), ("part_split", "u32"))
SPLIT_SUM_PUSH = PushConstants(("M", "u32"), ("N", "u32"), ("S", "u32"), ("part_split", "u32"), ("y_off", "u32"),
                               ("y_col", "u32"))
MM_ID_PUSH = PushConstants(*_COMMON, ("N", "u32"), *_OPERANDS, ("w_expert", "u32"), ("e0", "u32"),
                           ("n_expert", "u32"), ("n_used", "u32"), ("x_slot", "u32"), ("x_slots", "u32"),
                           ("y_slot", "u32"))


@dataclass(frozen=True)
class RouteEpilogue:
    """What the router's mat-vec (shaders/mul_mv_route.comp) needs to route its tokens in its
    last workgroup: the defines of moe_route.glsl (RWG, EPT, SUBGROUPS, NSG), the bindings of
    ids, weights, selection bias and the workgroup counters (`counters` of them, one a run of
    columns), and mat_vec.ROUTE_FIELDS' values."""

    defines: dict
    buffers: tuple
    push: dict
    counters: int = 1


@dataclass(frozen=True)
class NormInput:
    """The residual add and RMS norm the router's mat-vec does first (mul_mv_route's NORM_IN, see
    norm_input): x + residual is stored over x and rms_norm(x + residual) * weight, the mat-vec's
    input, into matmul's x, with rms_norm's bits."""

    x: Tensor
    residual: Tensor
    weight: Tensor
    eps: float


@dataclass(frozen=True)
class NormOutput:
    """The RMS norm the summed expert down projection's last workgroup does after adding into the
    residual stream (shaders/mul_mv_id_sum.comp): out = rms_norm(stream) * weight, rms_norm's
    bits; `counter` (I32, 0 between dispatches) counts its finished workgroups."""

    weight: Tensor
    eps: float
    out: Tensor
    counter: Tensor


def norm_input(device, x: Tensor, residual: Tensor, weight: Tensor, eps: float, out: Tensor) -> NormInput | None:
    """The NormInput for a router mat-vec reading out = rms_norm(x + residual) * weight (x + residual
    stored over x, as rms_norm with residual and sum_out=x stores it); None where the mat-vec cannot
    redo rms_norm's sums or hold the normed columns (norm_layout), or the columns are more than
    one mat-vec run (mat_vec_columns)."""
    k, n = x.ne[0], x.nelements // max(x.ne[0], 1)
    if k % 4 or n > mat_vec_columns(device.tuning) or norm_layout(device, k, n, device.tuning.mv_wg) is None:
        return None
    if weight.type != F32 or weight.nelements != k or out.ne != x.ne or residual.ne != x.ne:
        return None
    for t in (x, residual, out):
        if t.type != F32 or t.nb[0] != 4 or flat_rows(t) is None:
            return None
    if residual.nb != x.nb:
        return None
    return NormInput(x, residual, weight, float(eps))


def norm_output_fits(device, m: int, n_used: int, typ, k: int, tuning=None) -> bool:
    """Whether the summed expert down projection (m rows, K = k, n_used slots) can add into the
    residual stream and normalise it in its last workgroup (norm_layout for its workgroup): only where
    its workgroup takes the slots at once. Where one group walks them, a row a workgroup, the
    thousands of workgroups counting in and the tail in one small workgroup cost more than the
    norm's stage (H200, GCN table, 64 lanes a row as two 32-wide subgroups walking the slots:
    Qwen3-30B-A3B shape tg128 220.8 against 287.4 t/s)."""
    tune = tuning or device.tuning
    wg, lanes, _ = mat_vec_shape(device, typ, 1, tune, k=k, m=m, entry="mul_mv_id_sum", slots=n_used)
    return (m % 4 == 0 and slots_at_once(device.profile, lanes, mat_vec_wg(tune, experts=True))
            and norm_layout(device, m, 1, wg) is not None)


def gate_up_pair(gate: Tensor, up: Tensor, device, act: str):
    """(binding, gate byte offset, up byte offset) when gate and up weights can be read in one
    mat-vec pass (same type and layout, one binding covers both); else None."""
    if act not in GLU_ACTS or up.type != gate.type or up.ne != gate.ne or up.nb != gate.nb:
        return None
    check_layout(up, "up weight")
    both = bind_together([gate, up], device, min_align=WORD_ALIGN)
    if both is None:
        return None
    rng, (go, uo) = both
    return rng, go, uo


def gemm_kernel(device, typ, tuning, *, xvec4: bool, mul_mat_id: bool = False, split_k: bool = False):
    """The tiled GEMM pipeline for `typ` with the tuning table's tile (split_k: workgroup z sums
    one K range into a partial tile)."""
    bm, bn, bk, tm, tn = tuning.mm_bm, tuning.mm_bn, tuning.mm_bk, tuning.mm_tm, tuning.mm_tn
    defines = {**type_defines(typ, tuning), "BM": bm, "BN": bn, "BK": bk}
    if tuning.mm_coopmat:
        wm, wn = tuning.mm_cm_wm, tuning.mm_cm_wn
        if bm % wm or bn % wn or wm % 16 or wn % 16 or bk % 16:
            raise ConfigError(f"tuning: cooperative-matrix GEMM tile {bm}x{bn}x{bk} with subgroup tile {wm}x{wn} "
                              "must divide evenly into 16x16x16 fragments")
        defines.update(COOPMAT=1, WM=wm, WN=wn, SGS=device.profile.subgroup_size)
    elif bm % tm or bn % tn or bk % 4 or tm % 4 or tn % 4:
        raise ConfigError(f"tuning: GEMM tile {bm}x{bn}x{bk} with thread tile {tm}x{tn} must divide evenly "
                         "and BK, TM and TN be multiples of 4")
    else:
        defines.update(TM=tm, TN=tn)
    if xvec4:
        defines["XVEC4"] = 1
    if mul_mat_id:
        defines["MUL_MAT_ID"] = 1
    if split_k:
        defines["SPLIT_K"] = 1
    push = MM_ID_PUSH if mul_mat_id else MM_SPLIT_PUSH if split_k else MM_PUSH
    return kernel(device, "mul_mm", defines=defines, push=push)


def gemm_tuning(tuning, columns: float, *, spread: bool = False):
    """The tuning whose fp32 GEMM tile a product of `columns` token columns takes: mm_big_bm x
    mm_big_bn where the table sets it and the columns overflow one token tile of the table's
    (mm_bn), else the table's tile. With `spread` (mul_mat_id: `columns` is the pairs an expert
    has on average) already at one tile's width: the experts' counts spread around their mean,
    so about half of them would need two of the table's tiles."""
    if tuning.mm_coopmat or not tuning.mm_big_bn:
        return tuning
    wide = columns >= tuning.mm_bn if spread else columns > tuning.mm_bn
    return _wide_tile(tuning) if wide else tuning


@functools.lru_cache(maxsize=16)
def _wide_tile(tuning):
    """`tuning` with its wide GEMM tile as the tile (one object a tuning, however many GEMMs)."""
    return dataclasses.replace(tuning, mm_bm=tuning.mm_big_bm, mm_bn=tuning.mm_big_bn)


def gemm_splits(tuning, m: int, k: int, n: int) -> int:
    """The K ranges a GEMM of m rows, K = k and n tokens is cut into (1: none): tuning.mm_split_*.
    It depends on m, k and n's token tiles (mm_bn) only, so any slice of a product's tokens that
    passes the whole's column count (kernel_columns) is summed alike."""
    row_tiles, token_tiles = ceil_div(m, tuning.mm_bm), ceil_div(n, tuning.mm_bn)
    tiles = row_tiles * token_tiles
    if token_tiles > tuning.mm_split_max_tiles or tiles >= tuning.mm_split_groups:
        return 1
    steps = ceil_div(k, tuning.mm_bk)
    want = min(ceil_div(tuning.mm_split_groups, tiles), tuning.mm_split_max, steps // tuning.mm_split_min_steps)
    if want <= 1:
        return 1
    return ceil_div(steps, ceil_div(steps, want))   # no range left empty


def _gemm_split(seq, typ, tune, xvec4: bool, splits: int, wr, xr, yr, push: dict, m: int, n: int,
                work: FlashWork) -> None:
    """A GEMM over `splits` K ranges into partial tiles (in `work`), then their sum into y (push:
    MM_PUSH's)."""
    device = seq.device
    k_split = ceil_div(ceil_div(push["K"], tune.mm_bk), splits) * tune.mm_bk
    part = work.range("GEMM split-K partials", 4 * splits * m * n)
    kern = gemm_kernel(device, typ, tune, xvec4=xvec4, split_k=True)
    seq.dispatch(kern, [wr, xr, yr, part], push={**push, "k_split": k_split, "part_split": m * n},
                 groups=(ceil_div(m, tune.mm_bm), ceil_div(n, tune.mm_bn), splits))
    add = kernel(device, "split_sum", push=SPLIT_SUM_PUSH, workgroup=(tune.wg_size,))
    seq.dispatch(add, [part, yr], push=dict(M=m, N=n, S=splits, part_split=m * n, y_off=push["y_off"],
                                            y_col=push["y_col"]),
                 groups=grid(device, ceil_div(m * n, tune.wg_size)), label="split_sum")


def f32_operand(t: Tensor, what: str, k: int) -> Tensor:
    """An f32 tensor of rows of length k as a 2-D (k, columns) view."""
    if t.type != F32 or t.ne[0] != k:
        raise UnsupportedShape(f"{what} must be F32 with ne[0] = {k}, got {t!r}")
    if t.nb[0] != 4 or t.offset % 4 or any(t.nb[i] % 4 for i in (1, 2, 3)):
        raise UnsupportedShape(f"{what} {t!r} needs contiguous, 4-byte aligned rows")
    flat = flat_rows(t)
    if flat is None:
        raise UnsupportedShape(f"{what} {t!r}: its rows must be evenly spaced (dims 1..3 flatten into columns)")
    return flat


def vec4_ok(t: Tensor, off: int, *strides: int) -> bool:
    """Whether an f32 operand bound at float offset `off` can be read as vec4s."""
    return t.ne[0] % 4 == 0 and off % 4 == 0 and all(s % 4 == 0 for s in strides)


def matmul(seq, w: Tensor, x: Tensor, y: Tensor, *, tuning=None, max_binding: int | None = None,
           act: str = "silu", up_weight: Tensor | None = None, route: RouteEpilogue | None = None,
           kernel_columns: int | None = None, norm_in: NormInput | None = None,
           work: FlashWork | None = None) -> None:
    """Record y = W·x. W: (K, M) of a supported type; x: F32 (K, N...); y: F32 (M, N...), where
    N... are the columns (tokens), dims 1..3 flattened. N <= tuning.mv_chunk_n uses the mat-vec
    kernel (in runs of mv_max_n, at most mv_dense_max_n, columns), more the GEMM. W larger than one binding (or `max_binding` bytes) runs in row ranges.
    With `up_weight` (mat-vec sizes only;
    see gate_up_pair), y = act(W·x) * (up_weight·x) in one pass a run. With `route` (mat-vec
    sizes, a counter a run, W in one binding) a run's last workgroup also routes its tokens of y.
    `kernel_columns`: pick the mat-vec or the GEMM as for that many columns (x, y: a slice of a
    larger product, whose columns then get the same kernel, so the same sums, whatever slice
    they fall in). With `norm_in` (and `route`; see norm_input) x is the output of the add and
    norm the mat-vec does first. `work`: the caller's FlashWork, where a GEMM cut along K
    (gemm_splits) keeps its partial tiles; a GEMM that is cut needs one."""
    device = seq.device
    tune = tuning or device.tuning
    cols, most = mat_vec_columns(tune), mat_vec_most(tune)   # a run, all runs
    typ = kernel_type(w.type, f"matmul weight {w.name or ''}".rstrip())
    if w.ne[2] != 1 or w.ne[3] != 1:
        raise UnsupportedShape(f"matmul weight {w!r} must be 2-D (a stack of experts goes to mul_mat_id)")
    check_layout(w, "matmul weight")
    k, m = w.ne[0], w.ne[1]
    x2, y2 = f32_operand(x, "matmul x", k), f32_operand(y, "matmul y", m)
    n = x2.ne[1]
    if y2.ne[1] != n:
        raise UnsupportedShape(f"matmul: x has {n} columns, y has {y2.ne[1]}")
    xr, xo = bind_words(x2, "matmul x", device)
    yr, yo = bind_words(y2, "matmul y", device)
    xo, yo, x_col, y_col = xo // 4, yo // 4, x2.nb[1] // 4, y2.nb[1] // 4
    extra, extra_push = [], {}
    xvec4 = vec4_ok(x2, xo, x_col)
    if up_weight is not None:
        pair = gate_up_pair(w, up_weight, device, act) if n <= most else None
        if pair is None:
            raise UnsupportedShape(f"matmul: {w!r} and {up_weight!r} cannot be read in one pass (at most "
                                   f"{most} columns, same type and layout, one binding for both)")
        wide = wide_ok(typ, pair[1], pair[2], w.nb[1])
        for nc, xr, xo, yr, yo, xv in _column_runs(device, x2, y2, cols, xr, xo, yr, yo, xvec4):
            mv = mat_vec_kernel(device, typ, nc, tune, k=k, m=m, xvec4=xv, gate_up=act, wide=wide)
            push = {"K": k, "M": m, "w_off": pair[1], "w2_off": pair[2], "w_row": w.nb[1], "x_off": xo,
                    "x_col": x_col, "y_off": yo, "y_col": y_col}
            seq.dispatch(mv.kernel, [pair[0], xr, yr], push=push, groups=mv.groups(m, device), label="mul_mv gate/up")
        return
    pieces = [(a, b, *bind_words(w.slice(1, a, b), "matmul w", device, max_binding)) for a, b in chunks(1, device, max_binding, w)]
    if route is not None and (n > most or ceil_div(n, cols) > route.counters or len(pieces) > 1):
        raise UnsupportedShape(f"matmul: routing in the mat-vec takes at most {min(most, cols * route.counters)} "
                               f"columns and a weight in one binding; got {n} columns, {len(pieces)} pieces")
    if norm_in is not None:
        _norm_route(seq, w, typ, tune, pieces[0], norm_in, x2, y2, route)
        return
    if (kernel_columns or n) > most:
        gt = gemm_tuning(tune, kernel_columns or n)
        kern = gemm_kernel(device, typ, gt, xvec4=xvec4)
        for a, b, wr, wo in pieces:
            push = {"K": k, "M": b - a, "N": n, "w_off": wo, "w_row": w.nb[1], "x_off": xo, "x_col": x_col,
                    "y_off": yo + a, "y_col": y_col}
            splits = gemm_splits(gt, b - a, k, kernel_columns or n)
            if splits > 1:
                if work is None:
                    raise UnsupportedShape(f"matmul: a GEMM of {b - a} rows, K {k} and {n} columns is cut along K "
                                           f"({splits} ranges, gemm_splits) and needs work=, a FlashWork for "
                                           "its partial tiles")
                _gemm_split(seq, typ, gt, xvec4, splits, wr, xr, yr, push, b - a, n, work)
                continue
            seq.dispatch(kern, [wr, xr, yr], push=push, groups=(ceil_div(b - a, gt.mm_bm), ceil_div(n, gt.mm_bn), 1))
        return
    # the mat-vec, over runs of at most `cols` columns (the weights are read once a run)
    wide = wide_ok(typ, w.nb[1], *(p[3] for p in pieces))
    runs = _column_runs(device, x2, y2, cols, xr, xo, yr, yo, xvec4)
    for run, (nc, xr, xo, yr, yo, xvec4) in enumerate(runs):
        mv = mat_vec_kernel(device, typ, nc, tune, k=k, m=max(b - a for a, b, *_ in pieces), xvec4=xvec4,
                            wide=wide, entry="mul_mv" if route is None else "mul_mv_route",
                            route=route.defines if route is not None else None)
        if route is not None:   # a run routes its own tokens, counting its workgroups on its own counter
            first = run * cols * route.push["n_used"]
            extra, extra_push = list(route.buffers), {**route.push, "ids_off": route.push["ids_off"] + first,
                                                      "rw_off": route.push["rw_off"] + first,
                                                      "count_off": route.push["count_off"] + run}
        for a, b, wr, wo in pieces:
            push = {"K": k, "M": b - a, "w_off": wo, "w_row": w.nb[1], "x_off": xo, "x_col": x_col,
                    "y_off": yo + a, "y_col": y_col, **extra_push}
            seq.dispatch(mv.kernel, [wr, xr, yr, *extra], push=push, groups=mv.groups(b - a, device),
                         label="router" if route is not None else None)


def _column_runs(device, x: Tensor, y: Tensor, cols: int, xr, xo: int, yr, yo: int, xvec4: bool):
    """The mat-vec runs of at most `cols` of x's and y's columns: (columns, x's binding and float
    offset, y's, x in vec4s) a run. One run keeps the bindings given; several bind their own
    columns each, so no barrier separates them (the weights are read once a run)."""
    n = x.ne[1]
    if n <= cols:
        yield n, xr, xo, yr, yo, xvec4
        return
    for c0 in range(0, n, cols):
        nc = min(cols, n - c0)
        rxr, rxo = bind_words(x.slice(1, c0, c0 + nc), "matmul x", device)
        ryr, ryo = bind_words(y.slice(1, c0, c0 + nc), "matmul y", device)
        yield nc, rxr, rxo // 4, ryr, ryo // 4, xvec4 and rxo // 4 % 4 == 0


def _norm_route(seq, w: Tensor, typ, tune, piece, norm_in: NormInput, out: Tensor, y: Tensor,
                route: RouteEpilogue | None) -> None:
    """The router's mat-vec with the add and norm in its prologue (matmul's norm_in): x + r over x,
    out = rms_norm(x + r) * weight, y = W·out routed (one run: norm_input's checks)."""
    device = seq.device
    if route is None or out.ne[0] != w.ne[0]:
        raise UnsupportedShape(f"matmul: the norm in the router's mat-vec needs routing and x of {w.ne[0]} rows")
    k, m, n = w.ne[0], w.ne[1], out.ne[1]
    x = f32_operand(norm_in.x, "matmul norm x", k)
    if x.ne[1] != n:
        raise UnsupportedShape(f"matmul: the norm's x has {x.ne[1]} columns, its output {n}")
    (xr, xo), (rr, ro), (nwr, nwo) = (bind_words(t, f"matmul norm {what}", device) for t, what in
                                      ((x, "x"), (f32_operand(norm_in.residual, "matmul norm residual", k), "residual"),
                                       (norm_in.weight, "weight")))
    (orr, oo), (yr, yo) = bind_words(out, "matmul norm out", device), bind_words(y, "matmul y", device)
    xo, x_col = xo // 4, x.nb[1] // 4
    mv = mat_vec_kernel(device, typ, n, tune, k=k, m=m, xvec4=vec4_ok(x, xo, x_col), entry="mul_mv_route",
                        route=route.defines, norm_in=True)
    _, _, wr, wo = piece
    push = {"K": k, "M": m, "w_off": wo, "w_row": w.nb[1], "x_off": 0, "x_col": k, "y_off": yo // 4,
            "y_col": y.nb[1] // 4, **route.push, "n_x_off": xo, "n_x_col": x_col, "n_r_off": ro // 4,
            "n_w_off": nwo // 4, "n_s_off": xo, "n_o_off": oo // 4, "n_o_col": out.nb[1] // 4, "n_eps": norm_in.eps}
    seq.dispatch(mv.kernel, [wr, xr, yr, *route.buffers, rr, nwr, xr, orr], push=push, groups=mv.groups(m, device),
                 label="norm router")
