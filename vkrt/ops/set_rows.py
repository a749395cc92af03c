"""Scatter token rows into a KV cache at positions read from a tensor (replay-safe)."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import F16, F32, I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor, bind_words, f32_binding
from .grid import groups_for
from .kv_quant import check_rows, is_quantised, kvq_defines, kvq_words

SET_ROWS_PUSH = PushConstants(("ne0", "u32"), ("n_head", "u32"), ("n_tokens", "u32"), ("s_off", "u32"),
                              ("s_s1", "u32"), ("s_s2", "u32"), ("idx_off", "u32"), ("d_off", "u32"),
                              ("d_s1", "u32"), ("d_s2", "u32"))


def set_rows(seq, src: Tensor, rows: Tensor, dst: Tensor) -> None:
    """Record dst[:, rows[t], h] = src[:, h, t] for src F32 [ne0, n_head, n_tokens],
    dst F32/F16 [ne0, n_cells, n_head] (e.g. a layer's K cache) and rows I32 [n_tokens]; a dst of
    a quantised KV type (ops/kv_quant.py) gets each row quantised as ggml's reference does."""
    ne0, n_head, n_tokens = src.ne[0], src.ne[1], src.ne[2]
    if dst.ne[0] != ne0 or dst.ne[2] != n_head:
        raise OutOfRange(f"set_rows: src {list(src.ne)} does not fit dst {list(dst.ne)}")
    if is_quantised(dst):
        return _set_rows_q(seq, src, rows, dst)
    if dst.type not in (F32, F16) or dst.nb[0] != dst.type.type_size:
        raise GGMLTypeError(f"set_rows: dst must be F32 or F16 with contiguous rows, got {dst!r}")
    if rows.type is not I32 or rows.nelements < n_tokens or not rows.is_contiguous():
        raise GGMLTypeError(f"set_rows: rows must be a contiguous I32 tensor of {n_tokens}, got {rows!r}")
    if dst.type is F16 and not seq.device.profile.storage_16bit:
        raise GGMLTypeError(f"set_rows: {seq.device.profile.name} has no 16-bit storage for an F16 cache")
    sr, so, ss = f32_binding(src, "set_rows src")
    ir, io = bind_tensor(rows, "set_rows rows")
    dr, do = bind_tensor(dst, "set_rows dst")
    es = dst.type.type_size
    k = kernel(seq.device, "set_rows", defines={"DST_F16": int(dst.type is F16)}, push=SET_ROWS_PUSH,
               workgroup=(seq.device.tuning.wg_size,))
    n = ne0 * n_head * n_tokens
    seq.dispatch(k, [sr, ir, dr], push=dict(ne0=ne0, n_head=n_head, n_tokens=n_tokens, s_off=so, s_s1=ss[0],
                                            s_s2=ss[1], idx_off=io // 4, d_off=do // es, d_s1=dst.nb[1] // es,
                                            d_s2=dst.nb[2] // es),
                 groups=groups_for(k, n), label="set_rows")


def _set_rows_q(seq, src: Tensor, rows: Tensor, dst: Tensor) -> None:
    """set_rows into a quantised cache: an invocation a block."""
    ne0, n_head, n_tokens = src.ne[0], src.ne[1], src.ne[2]
    check_rows(dst, "set_rows dst")
    if rows.type is not I32 or rows.nelements < n_tokens or not rows.is_contiguous():
        raise GGMLTypeError(f"set_rows: rows must be a contiguous I32 tensor of {n_tokens}, got {rows!r}")
    sr, so, ss = f32_binding(src, "set_rows src")
    ir, io = bind_tensor(rows, "set_rows rows")
    dev = seq.device
    dr, do = bind_words(dst, "set_rows dst", dev)
    k = kernel(dev, "set_rows_q", defines=dict(KVQ_WORDS=kvq_words(dst), **kvq_defines(dst)), push=SET_ROWS_PUSH,
               workgroup=(dev.tuning.wg_size,))
    n = ne0 // 32 * n_head * n_tokens
    seq.dispatch(k, [sr, ir, dr], push=dict(ne0=ne0, n_head=n_head, n_tokens=n_tokens, s_off=so, s_s1=ss[0],
                                            s_s2=ss[1], idx_off=io // 4, d_off=do, d_s1=dst.nb[1], d_s2=dst.nb[2]),
                 groups=groups_for(k, n), label="set_rows")
