"""RMS norm over dim 0, fused with the weight multiply: y = x / rms(x) * w; optionally with the
residual add before it fused in as well (s = x + r; y = rms_norm(s) * w), or with a SiLU gate after
it (y = rms_norm(x) * w * silu(z), the gated norm of Gated DeltaNet layers)."""

from __future__ import annotations

from ..errors import OutOfRange
from ..memory import Tensor
from ..pipeline import PushConstants, kernel
from .binding import f32_binding
from .grid import grid
from .moe import ExpertSum
from .reduce import norm_wg, reduce_defines
from .rows import same_shape

RMS_PUSH = PushConstants(("ncols", "u32"), ("ne1", "u32"), ("ne2", "u32"), ("nrows", "u32"),
                         ("x_off", "u32"), ("x_s1", "u32"), ("x_s2", "u32"), ("x_s3", "u32"),
                         ("y_off", "u32"), ("y_s1", "u32"), ("y_s2", "u32"), ("y_s3", "u32"),
                         ("w_off", "u32"), ("use_w", "u32"), ("eps", "f32"))
ADD_RMS_PUSH = PushConstants(*RMS_PUSH.fields, ("r_off", "u32"), ("s_off", "u32"))
COMBINE_RMS_PUSH = PushConstants(*ADD_RMS_PUSH.fields, ("n_used", "u32"), ("ew_off", "u32"), ("es_off", "u32"),
                                 ("eg_off", "u32"), ("has_shared", "u32"))
GATED_RMS_PUSH = PushConstants(*RMS_PUSH.fields, ("z_off", "u32"), ("z_s1", "u32"), ("z_s2", "u32"), ("z_s3", "u32"))


def rms_norm(seq, x: Tensor, out: Tensor, eps: float, weight: Tensor | None = None, *,
             residual: Tensor | ExpertSum | None = None, sum_out: Tensor | None = None, gate: Tensor | None = None) -> None:
    """Record out = rms_norm(x) * weight (weight: F32 [ne0], broadcast over rows; None: no multiply).
    With `residual`: sum_out = x + residual first (sum_out may be x itself), and out = rms_norm(sum_out) * weight;
    residual and sum_out must be laid out like x. `residual` may be an ExpertSum (x [n_embd, tokens]
    contiguous): the MoE block's weighted sum of its experts, added as moe_combine would store it.
    With `gate` (F32 of x's shape, any strides with a contiguous dim 0; not with `residual`):
    out = rms_norm(x) * weight * silu(gate)."""
    same_shape(x, out, "rms_norm")
    xr, xo, xs = f32_binding(x, "rms_norm x")
    yr, yo, ys = f32_binding(out, "rms_norm out")
    if weight is not None:
        if weight.ne[0] != x.ne[0] or weight.nelements != x.ne[0]:
            raise OutOfRange(f"rms_norm: weight must have {x.ne[0]} elements, has shape {list(weight.ne)}")
        wr, wo, _ = f32_binding(weight, "rms_norm weight")
    else:
        wr, wo = xr, 0
    dev = seq.device
    wg = norm_wg(dev, x.ne[0])
    nrows = x.ne[1] * x.ne[2] * x.ne[3]
    push = dict(ncols=x.ne[0], ne1=x.ne[1], ne2=x.ne[2], nrows=nrows, x_off=xo, x_s1=xs[0], x_s2=xs[1], x_s3=xs[2],
                y_off=yo, y_s1=ys[0], y_s2=ys[1], y_s3=ys[2], w_off=wo, use_w=int(weight is not None), eps=float(eps))
    buffers = [xr, wr, yr]
    if gate is not None:
        if residual is not None:
            raise OutOfRange("rms_norm: gate and residual cannot be fused into one norm")
        same_shape(x, gate, "rms_norm gate")
        zr, zo, zs = f32_binding(gate, "rms_norm gate")
        buffers.append(zr)
        push.update(z_off=zo, z_s1=zs[0], z_s2=zs[1], z_s3=zs[2])
        k = kernel(dev, "rms_norm", defines={"GATE": 1, **reduce_defines(dev)}, push=GATED_RMS_PUSH, workgroup=(wg,))
        label = "gated_rms_norm"
    elif isinstance(residual, ExpertSum):
        sum_out = x if sum_out is None else sum_out
        same_shape(x, residual.out, "rms_norm experts' sum")
        same_shape(x, sum_out, "rms_norm sum_out")
        if not (x.is_contiguous() and sum_out.nb == x.nb) or x.ne[2] * x.ne[3] != 1:
            raise OutOfRange(f"rms_norm: the experts' sum needs x [n_embd, tokens] contiguous and sum_out alike, "
                             f"got {x!r} / {sum_out!r}")
        (yr, yo), (ewr, ewo), (esr, eso), (egr, ego) = residual.bindings("rms_norm experts' sum")
        sr, so, _ = f32_binding(sum_out, "rms_norm sum_out")
        buffers += [yr, sr, ewr, esr, egr]
        push.update(r_off=yo, s_off=so, n_used=residual.experts_out.ne[1], ew_off=ewo, es_off=eso, eg_off=ego,
                    has_shared=int(residual.shared is not None))
        k = kernel(dev, "rms_norm", defines={"ADD": 1, "COMBINE": 1, **reduce_defines(dev)}, push=COMBINE_RMS_PUSH,
                   workgroup=(wg,))
        label = "combine_rms_norm"
    elif residual is not None:
        sum_out = x if sum_out is None else sum_out
        for t, name in ((residual, "residual"), (sum_out, "sum_out")):
            same_shape(x, t, f"rms_norm {name}")
            if t.nb != x.nb:
                raise OutOfRange(f"rms_norm: {name} {t!r} must be laid out like x {x!r}")
        rr, ro, _ = f32_binding(residual, "rms_norm residual")
        sr, so, _ = f32_binding(sum_out, "rms_norm sum_out")
        buffers += [rr, sr]
        push.update(r_off=ro, s_off=so)
        k = kernel(dev, "rms_norm", defines={"ADD": 1, **reduce_defines(dev)}, push=ADD_RMS_PUSH, workgroup=(wg,))
        label = "add_rms_norm"
    else:
        k = kernel(dev, "rms_norm", defines=reduce_defines(dev), push=RMS_PUSH, workgroup=(wg,))  # WG: a power of two
        label = "rms_norm"
    seq.dispatch(k, buffers, push=push, groups=grid(dev, nrows), label=label)
