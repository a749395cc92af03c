"""Elementwise kernels on contiguous f32 tensors: fill, add/mul (b broadcast by repetition),
scale, the (gated) SiLU/GELU/sigmoid activations and gpt-oss's swiglu_oai (whose g may be a
strided view) and the output gate x * act(gate)."""

from __future__ import annotations

from ..errors import OutOfRange, VkrtError
from ..memory import Tensor
from ..pipeline import PushConstants, kernel
from .binding import f32_binding
from .grid import groups_for
from .rows import same_shape

FILL_PUSH = PushConstants(("n", "u32"), ("value", "u32"))
BINARY_PUSH = PushConstants(("n", "u32"), ("nb", "u32"), ("a_off", "u32"), ("b_off", "u32"), ("d_off", "u32"),
                            ("scale", "f32"))
GLU_PUSH = PushConstants(("n", "u32"), ("g_off", "u32"), ("u_off", "u32"), ("d_off", "u32"))
GLU_STRIDED_PUSH = PushConstants(*GLU_PUSH.fields, ("ne0", "u32"), ("ne1", "u32"), ("ne2", "u32"),
                                 ("g_s1", "u32"), ("g_s2", "u32"), ("g_s3", "u32"))
_OPS = {"add": 0, "mul": 1, "scale": 2}
_ACTS = {"silu": 0, "gelu": 1, "sigmoid": 2, "swiglu_oai": 3}


def fill(seq, dst, n: int, value: int) -> None:
    """Record dst[i] = value (a 32-bit pattern) for i < n; dst is a buffer range."""
    if dst.size < 4 * n:
        raise VkrtError(f"fill: range of {dst.size} bytes holds fewer than {n} 32-bit elements")
    k = kernel(seq.device, "fill", push=FILL_PUSH, workgroup=(seq.device.tuning.wg_size,))
    seq.dispatch(k, [dst], push={"n": n, "value": value & 0xFFFFFFFF}, groups=groups_for(k, n))


def _flat(t: Tensor, what: str):
    if not t.is_contiguous():
        raise OutOfRange(f"{what}: needs a contiguous tensor, got {t!r}")
    rng, off, _ = f32_binding(t, what)
    return rng, off


def _binary(seq, op: str, a: Tensor, b: Tensor | None, out: Tensor, scale: float = 1.0) -> None:
    n = a.nelements
    if out.nelements != n:
        raise OutOfRange(f"{op}: output has {out.nelements} elements, input {n}")
    ar, ao = _flat(a, f"{op} a")
    dr, do = _flat(out, f"{op} out")
    if b is not None:
        if n % b.nelements:
            raise OutOfRange(f"{op}: b with {b.nelements} elements does not tile a with {n}")
        br, bo = _flat(b, f"{op} b")
        nb = b.nelements
    else:
        br, bo, nb = ar, 0, 1
    k = kernel(seq.device, "binary", defines={"OP": _OPS[op]}, push=BINARY_PUSH,
               workgroup=(seq.device.tuning.wg_size,))
    seq.dispatch(k, [ar, br, dr], push=dict(n=n, nb=nb, a_off=ao, b_off=bo, d_off=do, scale=float(scale)),
                 groups=groups_for(k, n), label=op)


def add(seq, a: Tensor, b: Tensor, out: Tensor) -> None:
    """Record out = a + b (b repeated to a's size: same shape, or a bias broadcast over rows)."""
    _binary(seq, "add", a, b, out)


def mul(seq, a: Tensor, b: Tensor, out: Tensor) -> None:
    """Record out = a * b (b repeated to a's size)."""
    _binary(seq, "mul", a, b, out)


def scale(seq, a: Tensor, factor: float, out: Tensor) -> None:
    """Record out = a * factor."""
    _binary(seq, "scale", a, None, out, factor)


def activation(seq, act: str, g: Tensor, out: Tensor, up: Tensor | None = None) -> None:
    """Record out = act(g) * up (or act(g) without `up`); act is 'silu', 'gelu' or 'sigmoid', or
    'swiglu_oai' (gpt-oss: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(up, -7, 7) + 1)).
    out and up are contiguous (out may be up itself); g is contiguous, or any F32 view of out's
    shape with a contiguous dim 0."""
    if act not in _ACTS:
        raise VkrtError(f"activation {act!r} is not supported (supported: {', '.join(_ACTS)})")
    if act == "swiglu_oai" and up is None:
        raise VkrtError("activation swiglu_oai is gated: it needs `up`")
    n = g.nelements
    if out.nelements != n or (up is not None and up.nelements != n):
        raise OutOfRange(f"{act}: element counts differ: g {n}, out {out.nelements}"
                         + (f", up {up.nelements}" if up is not None else ""))
    if g.is_contiguous():
        gr, go = _flat(g, f"{act} g")
        push, layout = dict(g_off=go), GLU_PUSH
    else:
        if g.ne != out.ne:
            raise OutOfRange(f"{act}: a strided g must have out's shape {list(out.ne)}, got {g!r}")
        gr, go, gs = f32_binding(g, f"{act} g")
        push = dict(g_off=go, ne0=g.ne[0], ne1=g.ne[1], ne2=g.ne[2], g_s1=gs[0], g_s2=gs[1], g_s3=gs[2])
        layout = GLU_STRIDED_PUSH
    dr, do = _flat(out, f"{act} out")
    ur, uo = _flat(up, f"{act} up") if up is not None else (gr, 0)
    push.update(n=n, u_off=uo, d_off=do)
    defines = {"ACT": _ACTS[act], "GATED": int(up is not None), "G_STRIDED": int(layout is GLU_STRIDED_PUSH)}
    k = kernel(seq.device, "glu", defines=defines, push=layout, workgroup=(seq.device.tuning.wg_size,))
    seq.dispatch(k, [gr, ur, dr], push=push, groups=groups_for(k, n), label=act)


def gate_mul(seq, x: Tensor, gate: Tensor, out: Tensor, *, act: str = "sigmoid") -> None:
    """Record out = x * act(gate); with the default sigmoid, gated attention's output gate. x, out:
    contiguous F32 of one shape (out may be x); gate: an F32 view of that shape with a contiguous
    dim 0 (e.g. ne (D, H, T), nb (4, 8D, 8DH): the gate half of each head of the query projection)."""
    same_shape(x, out, "gate_mul")
    same_shape(x, gate, "gate_mul gate")
    activation(seq, act, gate, out, up=x)
