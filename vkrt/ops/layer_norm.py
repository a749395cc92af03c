"""LayerNorm with weight and bias over dim 0 (the vision encoders' norm): y = (x - mean(x)) /
sqrt(var(x) + eps) * w + b, a workgroup a row."""

from __future__ import annotations

from ..errors import OutOfRange
from ..memory import Tensor
from ..pipeline import PushConstants, kernel
from .binding import f32_binding
from .grid import grid
from .rows import same_shape

LAYER_NORM_PUSH = PushConstants(("ncols", "u32"), ("nrows", "u32"), ("x_off", "u32"), ("y_off", "u32"),
                                ("w_off", "u32"), ("b_off", "u32"), ("eps", "f32"))
WG = 64


def layer_norm(seq, x: Tensor, out: Tensor, weight: Tensor, bias: Tensor, eps: float) -> None:
    """Record out = layer_norm(x) * weight + bias; x and out contiguous F32 [ncols, rows...],
    weight and bias F32 [ncols]."""
    same_shape(x, out, "layer_norm")
    if not (x.is_contiguous() and out.is_contiguous()):
        raise OutOfRange(f"layer_norm: x {x!r} and out {out!r} must be contiguous")
    ncols = x.ne[0]
    for t, what in ((weight, "weight"), (bias, "bias")):
        if t.nelements != ncols:
            raise OutOfRange(f"layer_norm: {what} must have {ncols} elements, has shape {list(t.ne)}")
    xr, xo, _ = f32_binding(x, "layer_norm x")
    yr, yo, _ = f32_binding(out, "layer_norm out")
    wr, wo, _ = f32_binding(weight, "layer_norm weight")
    br, bo, _ = f32_binding(bias, "layer_norm bias")
    nrows = x.nelements // ncols
    k = kernel(seq.device, "layer_norm", push=LAYER_NORM_PUSH, workgroup=(WG,))
    seq.dispatch(k, [xr, wr, br, yr], push=dict(ncols=ncols, nrows=nrows, x_off=xo, y_off=yo, w_off=wo, b_off=bo,
                                                  eps=float(eps)), groups=grid(seq.device, nrows), label="layer_norm")
