"""RoPE with the q/k RMS norm before it and, for K, the store into the cache after it (and V's
store into its cache alongside): one kernel (shaders/norm_rope.comp) for what rms_norm, rope and
set_rows do apart, with the same bits; for a quantised cache also the Walsh-Hadamard rotation it
is stored in (ops/hadamard.py) and the quantisation (set_rows_q)."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import F16, F32, I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor, bind_words, f32_binding
from .grid import grid
from .hadamard import rotation_defines
from .kv_quant import check_rows, is_quantised, kvq_defines, kvq_words
from .reduce import norm_wg, reduce_defines
from .rope import rope_defines, rope_flag_defines, rope_operands
from .rows import same_shape

NORM_ROPE_PUSH = PushConstants(
    *((n, "u32") for n in ("head_dim", "n_dims", "n_head", "n_tokens", "x_off", "x_s1", "x_s2", "w_off", "y_off",
                           "y_head", "y_tok", "pos_off", "ff_off", "use_ff", "neox", "rows_off")),
    ("eps", "f32"), ("theta_scale", "f32"), ("freq_scale", "f32"), ("attn_factor", "f32"),
    ("ext_factor", "f32"), ("corr_low", "f32"), ("corr_high", "f32"),
    ("interleaved", "u32"), ("v_off", "u32"), ("vd_off", "u32"), ("temp_scale", "f32"), ("temp_floor", "f32"),
    ("sections", "uvec4"))
# WITH_Q: the rotation's flags and sections become defines and the queries' fields take their place
_Q_DEFINED = ("use_ff", "neox", "interleaved", "temp_scale", "temp_floor", "sections")
NORM_ROPE_Q_PUSH = PushConstants(
    *(f for f in NORM_ROPE_PUSH.fields if f[0] not in _Q_DEFINED),
    *((n, "u32") for n in ("q_n_head", "q_x_off", "q_x_s1", "q_x_s2", "q_w_off", "q_y_off", "q_y_head", "q_y_tok")))


def norm_rope(seq, x: Tensor, positions: Tensor, out: Tensor, *, weight: Tensor | None = None, eps: float = 0.0,
              rows: Tensor | None = None, store_v: tuple[Tensor, Tensor] | None = None,
              with_q: tuple[Tensor, Tensor, Tensor | None] | None = None, k_rot: int = 0, v_rot: int = 0,
              **rope_args) -> None:
    """Record rope(rms_norm(x) * weight) for x F32 [head_dim, n_head, n_tokens] (weight None: no
    norm; x may be a strided view, e.g. the query half of a [query, gate] projection). rows None:
    out is laid out like x (F32); else out is a cache F32/F16 [head_dim, n_cells, n_head] and
    token t goes to cell rows[t] (I32). rope_args as rope(), sections and YaRN included.
    store_v = (v, v_cache) with rows: also set_rows(v, rows, v_cache) in the same dispatch, for v
    laid out like x and v_cache like out (see can_store_v). with_q = (q, q_out, q_weight) with rows:
    also the queries' norm_rope(q, positions, q_out, weight=q_weight) in the same dispatch, q of
    x's head size and tokens, q_weight given exactly where weight is, no attention temperature
    (see can_ride_q). k_rot: the rotated rows (q's too) are Walsh-Hadamard rotated in runs of
    k_rot before they are stored, as hadamard() would rotate them (0: not); v_rot: V's, with
    store_v. A quantised cache (out, and V's with store_v: the same type) is written as
    set_rows would (its rows whole blocks)."""
    head_dim, n_head, n_tokens = x.ne[0], x.ne[1], x.ne[2]
    (pr, fr), push = rope_operands(x, positions, op="norm_rope", **rope_args)
    xr, xo, xs = f32_binding(x, "norm_rope x")
    buffers = [xr]
    if weight is not None:
        if weight.nelements != head_dim or weight.ne[0] != head_dim:
            raise OutOfRange(f"norm_rope: weight must have {head_dim} elements, has shape {list(weight.ne)}")
        wr, wo, _ = f32_binding(weight, "norm_rope weight")
    else:
        wr, wo = xr, 0
    buffers += [wr, pr, fr]
    defines = {"MAX_HEAD": head_dim, **rope_defines(push)}
    if weight is not None:
        defines["NORM"] = 1
    if k_rot:
        if head_dim % k_rot:
            raise OutOfRange(f"norm_rope: runs of {k_rot} do not divide the head ({head_dim})")
        defines.update(rotation_defines("K_ROT", k_rot, "norm_rope"))
    if v_rot:
        if store_v is None or head_dim % v_rot or not is_quantised(store_v[1]):
            raise OutOfRange(f"norm_rope: V's rotation (runs of {v_rot}) rides with its store (store_v) into a "
                             f"quantised cache, in runs that divide the head ({head_dim})")
        defines.update(rotation_defines("V_ROT", v_rot, "norm_rope"))
    if rows is None:
        if store_v is not None:
            raise OutOfRange("norm_rope: store_v needs rows (a cache store)")
        same_shape(x, out, "norm_rope")
        yr, yo, ys = f32_binding(out, "norm_rope out")
        buffers += [yr, pr]   # binding 5 is unused without rows
        push.update(y_off=yo, y_head=ys[0], y_tok=ys[1], rows_off=0)
    else:
        if out.ne[0] != head_dim or out.ne[2] != n_head:
            raise OutOfRange(f"norm_rope: x {list(x.ne)} does not fit the cache {list(out.ne)}")
        quantised = is_quantised(out)
        if quantised:
            check_rows(out, "norm_rope cache")
        elif out.type not in (F32, F16) or out.nb[0] != out.type.type_size:
            raise GGMLTypeError(f"norm_rope: the cache must be F32, F16 or a quantised KV type with contiguous "
                                f"rows, got {out!r}")
        if out.type is F16 and not seq.device.profile.storage_16bit:
            raise GGMLTypeError(f"norm_rope: {seq.device.profile.name} has no 16-bit storage for an F16 cache")
        if rows.type is not I32 or rows.nelements < n_tokens or not rows.is_contiguous():
            raise GGMLTypeError(f"norm_rope: rows must be a contiguous I32 tensor of {n_tokens}, got {rows!r}")
        yr, yo = bind_words(out, "norm_rope out", seq.device) if quantised else bind_tensor(out, "norm_rope out")
        rr, ro = bind_tensor(rows, "norm_rope rows")
        es = 1 if quantised else out.type.type_size   # a quantised cache's fields count bytes
        buffers += [yr, rr]
        push.update(y_off=yo // es, y_head=out.nb[2] // es, y_tok=out.nb[1] // es, rows_off=ro // 4)
        defines["ROWS"] = 1
        if out.type is F16:
            defines["DST_F16"] = 1
        if quantised:
            defines.update(DST_Q=1, KVQ_WORDS=kvq_words(out), **kvq_defines(out))
        if store_v is not None:
            v, v_cache = store_v
            if not can_store_v(x, out, v, v_cache):
                raise OutOfRange(f"norm_rope: V {v!r} / its cache {v_cache!r} are not laid out as x / out")
            vr, vo = bind_tensor(v, "norm_rope v")
            vdr, vdo = (bind_words(v_cache, "norm_rope v_cache", seq.device) if quantised
                        else bind_tensor(v_cache, "norm_rope v_cache"))
            buffers += [vr, vdr]
            push.update(v_off=vo // 4, vd_off=vdo // es)
            defines["STORE_V"] = 1
    push.setdefault("v_off", 0)
    push.setdefault("vd_off", 0)
    push.update(x_off=xo, x_s1=xs[0], x_s2=xs[1], w_off=wo, eps=float(eps))
    dev = seq.device
    layout, groups = NORM_ROPE_PUSH, n_head * n_tokens
    if with_q is not None:
        q, q_out, q_weight = with_q
        if rows is None or not can_ride_q(x, q, q_out, weight, q_weight, push):
            raise OutOfRange(f"norm_rope: the queries {q!r} cannot ride in K's dispatch (see can_ride_q)")
        if store_v is None:   # bindings 6 and 7 (V and its cache) are unused without V's store
            buffers += [xr, yr]
        qr_, qo, qs = f32_binding(q, "norm_rope q")
        qwr, qwo = (f32_binding(q_weight, "norm_rope q weight")[:2] if q_weight is not None else (qr_, 0))
        qyr, qyo, qys = f32_binding(q_out, "norm_rope q out")
        buffers += [qr_, qwr, qyr]
        defines.update(WITH_Q=1, **rope_flag_defines(push))
        for f in _Q_DEFINED:
            push.pop(f)
        push.update(q_n_head=q.ne[1], q_x_off=qo, q_x_s1=qs[0], q_x_s2=qs[1], q_w_off=qwo, q_y_off=qyo,
                    q_y_head=qys[0], q_y_tok=qys[1])
        layout, groups = NORM_ROPE_Q_PUSH, (n_head + q.ne[1]) * n_tokens
    k = kernel(dev, "norm_rope", defines={**defines, **reduce_defines(dev)}, push=layout,
               workgroup=(norm_wg(dev, head_dim),))
    seq.dispatch(k, buffers, push=push, groups=grid(dev, groups),
                 label="norm_rope" if weight is not None else "rope")


def can_ride_q(k: Tensor, q: Tensor, q_out: Tensor, weight: Tensor | None, q_weight: Tensor | None,
               push: dict) -> bool:
    """Whether the queries' norm_rope (q -> q_out, q_weight) can ride in K's (k, weight) dispatch:
    q F32 [head_dim, n_head_q, n_tokens] of k's head size and tokens, q_out laid out like q (F32),
    both normed or neither, and no attention temperature (rope_operands' push fields)."""
    return (q.type is F32 and q.ne[0] == k.ne[0] and q.ne[2] == k.ne[2] and q.ne[3] == 1
            and q_out.type is F32 and q_out.ne == q.ne and (weight is None) == (q_weight is None)
            and (q_weight is None or q_weight.nelements == q.ne[0]) and not push.get("temp_scale"))


def can_store_v(x: Tensor, out: Tensor, v: Tensor, v_cache: Tensor) -> bool:
    """Whether norm_rope's K store (x -> out) can carry V's (v -> v_cache) in its dispatch: V is
    shaped and strided as x and its cache as K's (of K's type), both F32 with 4-byte aligned
    offsets (a quantised cache's rows whole blocks at even offsets)."""
    align = 2 if is_quantised(out) else out.type.type_size
    return (v.ne == x.ne and v.nb == x.nb and v.type is F32 and x.type is F32 and v_cache.type is out.type
            and v_cache.ne == out.ne and v_cache.nb == out.nb
            and bind_tensor(v, "can_store_v v")[1] % 4 == 0 and bind_tensor(v_cache, "can_store_v v_cache")[1] % align == 0)
