"""Masked softmax along dim 0 (ggml soft_max_ext, plus softcap): out = softmax(x')

    x' = softcap * tanh(scale * x / softcap)  (x' = scale * x without softcap)  + slope * mask

with ALiBi's slope for head i2 of ne[2] heads when max_bias > 0 (else 1). Rows where x' is -inf
everywhere come out as zeros. x: F32 [ne0, ne1, ne2, ne3], any strides with dim 0 contiguous;
out: contiguous F32 of the same sizes, or x itself; mask: F16 [ne0, >= ne1, nem2, nem3] with nem2
dividing ne2 and nem3 dividing ne3 (row i1 of plane (i2 % nem2, i3 % nem3)). sinks (attention
sinks, gpt-oss): F32 [ne2], one value a head i2 that counts in the softmax's denominator as
exp(sink) would, with no output of its own (ggml's soft_max_add_sinks).
"""

from __future__ import annotations

from ..errors import UnsupportedShape
from ..memory import F16, F32, Tensor
from ..pipeline import PushConstants, kernel
from .attn_shapes import element_strides
from .binding import bind_tensor, f32_binding

SOFTMAX_PUSH = PushConstants(*((n, "u32") for n in ("ne0", "x_off", "x_nb1", "x_nb2", "x_nb3", "o_off", "m_off",
                                                     "m_nb1", "m_nb2", "m_nb3", "nem2", "nem3")),
                             ("scale", "f32"), ("softcap", "f32"), ("max_bias", "f32"), ("s_off", "u32"))


def _check(x: Tensor, out: Tensor, mask: Tensor | None, max_groups) -> None:
    if x.type != F32 or out.type != F32 or x.nb[0] != 4:
        raise UnsupportedShape(f"soft_max needs F32 x with dim 0 contiguous and F32 out, got {x!r} -> {out!r}")
    if out.ne != x.ne or not out.is_contiguous():
        raise UnsupportedShape(f"soft_max out must be contiguous with x's sizes {x.ne}, got {out!r}")
    if any(n > m for n, m in zip(x.ne[1:], max_groups)):
        raise UnsupportedShape(f"soft_max runs one workgroup per row: {x.ne[1:]} rows exceed the device's "
                               f"workgroup counts {tuple(max_groups)}")
    if mask is not None:
        if (mask.type != F16 or mask.nb[0] != 2 or mask.ne[0] != x.ne[0] or mask.ne[1] < x.ne[1]
                or x.ne[2] % mask.ne[2] or x.ne[3] % mask.ne[3]):
            raise UnsupportedShape(f"soft_max mask must be F16 [{x.ne[0]}, >= {x.ne[1]}, a divisor of {x.ne[2]}, "
                                   f"a divisor of {x.ne[3]}] with dim 0 contiguous, got {mask!r}")


def soft_max(seq, x: Tensor, out: Tensor, mask: Tensor | None = None, *, scale: float = 1.0,
             softcap: float = 0.0, max_bias: float = 0.0, sinks: Tensor | None = None) -> None:
    """Record out = masked softmax of x along dim 0 (see the module docstring)."""
    dev = seq.device
    _check(x, out, mask, dev.profile.max_workgroup_count)
    wg = 1 << (dev.tuning.reduce_wg.bit_length() - 1)  # the reduction halves: a power of two
    x_rng, x_off = bind_tensor(x, "soft_max x", dev)
    o_rng, o_off = bind_tensor(out, "soft_max out", dev)
    x_nb1, x_nb2, x_nb3 = element_strides(x)
    push = dict(ne0=x.ne[0], x_off=x_off // 4, x_nb1=x_nb1, x_nb2=x_nb2, x_nb3=x_nb3, o_off=o_off // 4,
                m_off=0, m_nb1=0, m_nb2=0, m_nb3=0, nem2=1, nem3=1,
                scale=scale / softcap if softcap else scale, softcap=softcap, max_bias=max_bias)
    buffers = [x_rng, o_rng]
    if mask is not None:
        m_rng, m_off = bind_tensor(mask, "soft_max mask", dev)
        buffers.append(m_rng)
        push["m_nb1"], push["m_nb2"], push["m_nb3"] = element_strides(mask)
        push.update(m_off=m_off // 2, nem2=mask.ne[2], nem3=mask.ne[3])
    push["s_off"] = 0
    if sinks is not None:
        if sinks.nelements != x.ne[2] or not sinks.is_contiguous():
            raise UnsupportedShape(f"soft_max sinks must be {x.ne[2]} contiguous F32 values (one a head), "
                                   f"got {sinks!r}")
        s_rng, push["s_off"], _ = f32_binding(sinks, "soft_max sinks")
        buffers.append(s_rng)
    k = kernel(dev, "softmax", push=SOFTMAX_PUSH,
               defines=dict(WG=wg, HAS_MASK=int(mask is not None), SINKS=int(sinks is not None)))
    seq.dispatch(k, buffers, push=push, groups=tuple(x.ne[1:]), label="soft_max")
