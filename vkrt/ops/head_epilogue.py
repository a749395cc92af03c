"""The per-head epilogue of attention's q, k and v projections (mul_mv HEAD_EPI,
shaders/mv_head_epi.glsl): what norm_rope does after them -- the q/k RMS norm, RoPE and the
stores into the KV cache -- done, bit for bit, by the last workgroup of a projection's mat-vec to
finish each head, so a decode step has no norm_rope dispatch and barrier between the projections
and the attention."""

from __future__ import annotations

from ..memory import F16, F32, I32, Tensor
from .binding import bind_tensor, f32_binding
from .matmul import HEAD_EPI_FIELDS, HeadEpilogue
from .reduce import butterfly_subgroups, norm_wg
from .rope import rope_flag_defines, rope_operands


def head_epilogue(seq, y: Tensor, head_dim: int, counters: Tensor, dst: Tensor, *, block: int | None = None,
                  weight: Tensor | None = None, eps: float = 0.0, positions: Tensor | None = None,
                  rows: Tensor | None = None, rope_args: dict | None = None) -> HeadEpilogue | None:
    """The HeadEpilogue of a projection into y (F32 [M, T] contiguous: M / block heads of `block`
    rows, default head_dim; a head's first head_dim rows are its own, the rest -- a gated query's
    gate -- stay in y). Each head is normed by `weight` (F32 [head_dim]; None: not normed), rotated
    with rope_args at `positions` as norm_rope rotates (None: not rotated) and stored into dst:
    F32 [head_dim, heads, T] (rows None) or a cache F32/F16 [head_dim, cells, heads] at cell
    rows[t] (I32). `counters`: I32 of at least M / block elements holding 0 (left 0). None where
    the mat-vec cannot give norm_rope's bits: the norm's sums (butterfly_subgroups), an attention
    temperature, a destination the store cannot take."""
    dev = seq.device
    block = block or head_dim
    m, n_tok = y.ne[0], y.nelements // max(y.ne[0], 1)
    if (y.type is not F32 or not y.is_contiguous() or m % block or head_dim > block or head_dim % 2
            or counters.type is not I32 or counters.nelements < m // block):
        return None
    heads = m // block
    defines = {"EPI_HD": head_dim, "EPI_NORM": int(weight is not None), "EPI_ROPE": int(positions is not None),
               "EPI_ROWS": int(rows is not None), "DST_F16": int(dst.type is F16)}
    push = {f: 0.0 if t == "f32" else 0 for f, t in HEAD_EPI_FIELDS}
    cr, co = bind_tensor(counters, "head epilogue counters")
    push.update(e_hb=block, e_count_off=co // 4)
    yr = bind_tensor(y, "head epilogue y")[0]
    wr = pr = fr = rr = yr   # stand-ins where a binding is unused
    if weight is not None:
        sg, wg = dev.profile.subgroup_min, norm_wg(dev, head_dim)
        if (butterfly_subgroups(dev, head_dim) is None or wg > dev.tuning.mv_wg or dev.tuning.mv_wg % sg
                or weight.type is not F32 or weight.nelements != head_dim):
            return None
        wr, push["e_w_off"], _ = f32_binding(weight, "head epilogue norm weight")
        defines.update(EPI_WG=wg, EPI_SG=sg)
        push["e_eps"] = float(eps)
    if positions is not None:
        x3 = y.view((head_dim, heads, n_tok), nb=(4, 4 * block, 4 * m))
        (pr, fr), rope = rope_operands(x3, positions, op="head epilogue", **(rope_args or {}))
        if rope["temp_scale"]:
            return None
        defines.update(rope_flag_defines(rope))
        push.update(e_pos_off=rope["pos_off"], e_ff_off=rope["ff_off"], e_n_tok=rope["n_tokens"],
                    e_n_dims=rope["n_dims"], e_theta_scale=rope["theta_scale"], e_freq_scale=rope["freq_scale"],
                    e_attn_factor=rope["attn_factor"], e_ext_factor=rope["ext_factor"], e_corr_low=rope["corr_low"],
                    e_corr_high=rope["corr_high"])
    if rows is None:
        if dst.type is not F32 or tuple(dst.ne[:3]) != (head_dim, heads, n_tok):
            return None
        dr, push["e_d_off"], (push["e_d_head"], push["e_d_tok"], _) = f32_binding(dst, "head epilogue out")
    else:
        if (dst.type not in (F32, F16) or dst.nb[0] != dst.type.type_size or dst.ne[0] != head_dim
                or dst.ne[2] != heads or (dst.type is F16 and not dev.profile.storage_16bit)):
            return None
        if rows.type is not I32 or rows.nelements < n_tok or not rows.is_contiguous():
            return None
        es = dst.type.type_size
        dr, do = bind_tensor(dst, "head epilogue cache")
        rr, ro = bind_tensor(rows, "head epilogue rows")
        if do % es:
            return None
        push.update(e_d_off=do // es, e_d_head=dst.nb[2] // es, e_d_tok=dst.nb[1] // es, e_rows_off=ro // 4)
    return HeadEpilogue(defines, (cr, wr, pr, fr, rr, dr), push, block)

