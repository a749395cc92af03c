"""RMS norm over dim 0, fused with the weight multiply: y = x / rms(x) * w."""

from __future__ import annotations

from ..errors import OutOfRange
from ..memory import Tensor
from ..pipeline import PushConstants, kernel
from .rows import f32_binding, row_groups, same_shape

RMS_PUSH = PushConstants(("ncols", "u32"), ("ne1", "u32"), ("ne2", "u32"), ("nrows", "u32"),
                         ("x_off", "u32"), ("x_s1", "u32"), ("x_s2", "u32"), ("x_s3", "u32"),
                         ("y_off", "u32"), ("y_s1", "u32"), ("y_s2", "u32"), ("y_s3", "u32"),
                         ("w_off", "u32"), ("use_w", "u32"), ("eps", "f32"))


def rms_norm(seq, x: Tensor, out: Tensor, eps: float, weight: Tensor | None = None) -> None:
    """Record out = rms_norm(x) * weight (weight: F32 [ne0], broadcast over rows; None: no multiply)."""
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
    wg = dev.tuning.reduce_wg
    k = kernel(dev, "rms_norm", push=RMS_PUSH, workgroup=(wg,))  # WG must be a power of two
    nrows = x.ne[1] * x.ne[2] * x.ne[3]
    seq.dispatch(k, [xr, wr, yr], push=dict(
        ncols=x.ne[0], ne1=x.ne[1], ne2=x.ne[2], nrows=nrows, x_off=xo, x_s1=xs[0], x_s2=xs[1], x_s3=xs[2],
        y_off=yo, y_s1=ys[0], y_s2=ys[1], y_s3=ys[2], w_off=wo, use_w=int(weight is not None), eps=float(eps)),
        groups=row_groups(nrows, dev), label="rms_norm")
