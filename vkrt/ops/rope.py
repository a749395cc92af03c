"""Rotary position embedding (llama.cpp's NORMAL and NEOX modes) with positions read from a
tensor, so a recorded sequence can be replayed at new positions."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor
from .rows import f32_binding, same_shape

ROPE_PUSH = PushConstants(
    ("head_dim", "u32"), ("n_dims", "u32"), ("n_head", "u32"), ("n_tokens", "u32"),
    ("x_off", "u32"), ("x_s1", "u32"), ("x_s2", "u32"), ("y_off", "u32"), ("y_s1", "u32"), ("y_s2", "u32"),
    ("pos_off", "u32"), ("ff_off", "u32"), ("use_ff", "u32"), ("neox", "u32"),
    ("theta_scale", "f32"), ("freq_scale", "f32"), ("attn_factor", "f32"))


def rope_operands(x: Tensor, positions: Tensor, *, n_dims: int, freq_base: float, freq_scale: float = 1.0,
                  neox: bool = False, freq_factors: Tensor | None = None, attn_factor: float = 1.0,
                  op: str = "rope") -> tuple[list, dict]:
    """Checks x [head_dim, n_head, n_tokens] and the rotation's arguments; returns the bindings of
    positions and frequency factors and the push fields they share with norm_rope."""
    head_dim, n_head, n_tokens = x.ne[0], x.ne[1], x.ne[2]
    if x.ne[3] != 1:
        raise OutOfRange(f"{op}: x must be 3-D [head_dim, n_head, n_tokens], got {list(x.ne)}")
    if head_dim % 2 or n_dims % 2 or not 0 < n_dims <= head_dim:
        raise OutOfRange(f"{op}: n_dims {n_dims} must be even and at most the (even) head size {head_dim}")
    if positions.type is not I32 or positions.nelements < n_tokens or not positions.is_contiguous():
        raise GGMLTypeError(f"{op}: positions must be a contiguous I32 tensor of {n_tokens}, got {positions!r}")
    pr, po = bind_tensor(positions)
    if freq_factors is not None:
        if freq_factors.nelements < n_dims // 2:
            raise OutOfRange(f"{op}: freq_factors need {n_dims // 2} values, got {freq_factors.nelements}")
        fr, fo, _ = f32_binding(freq_factors, f"{op} freq_factors")
    else:
        fr, fo = pr, 0
    push = dict(head_dim=head_dim, n_dims=n_dims, n_head=n_head, n_tokens=n_tokens, pos_off=po // 4, ff_off=fo,
                use_ff=int(freq_factors is not None), neox=int(neox), theta_scale=float(freq_base) ** (-2.0 / n_dims),
                freq_scale=float(freq_scale), attn_factor=float(attn_factor))
    return [pr, fr], push


def rope(seq, x: Tensor, positions: Tensor, out: Tensor, **rope_args) -> None:
    """Record out = rope(x) for x [head_dim, n_head, n_tokens] F32 and positions I32 [n_tokens];
    rope_args: n_dims, freq_base, freq_scale, neox, freq_factors, attn_factor (see rope_operands)."""
    same_shape(x, out, "rope")
    (pr, fr), push = rope_operands(x, positions, **rope_args)
    xr, xo, xs = f32_binding(x, "rope x")
    yr, yo, ys = f32_binding(out, "rope out")
    dev = seq.device
    k = kernel(dev, "rope", push=ROPE_PUSH, workgroup=(dev.tuning.wg_size,))
    n = x.ne[0] // 2 * x.ne[1] * x.ne[2]
    seq.dispatch(k, [xr, pr, fr, yr], push=dict(push, x_off=xo, x_s1=xs[0], x_s2=xs[1], y_off=yo, y_s1=ys[0],
                                                 y_s2=ys[1]), groups=k.groups_for(n), label="rope")
