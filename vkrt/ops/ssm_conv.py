"""Causal depthwise conv1d with a per-sequence state, fused with SiLU: the short convolution that
Gated DeltaNet layers run over their fused QKV projection (llama.cpp's ssm_conv + silu)."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor, f32_binding
from .grid import ceil_div, groups_for
from .rows import same_shape

SSM_CONV_PUSH = PushConstants(
    ("n", "u32"), ("channels", "u32"), ("seq_len", "u32"), ("n_chunks", "u32"), ("chunk", "u32"),
    ("x_off", "u32"), ("x_s1", "u32"), ("y_off", "u32"), ("y_s1", "u32"), ("w_off", "u32"),
    ("s_off", "u32"), ("s_s1", "u32"), ("s_s2", "u32"), ("slot_off", "u32"))
MAX_KERNEL = 8   # taps: the window lives in registers



def ssm_conv(seq, x: Tensor, weight: Tensor, state: Tensor, slots: Tensor, out: Tensor, *, n_seqs: int) -> None:
    """Record out = silu(causal depthwise conv1d of x) and advance the conv states.

    x, out: F32 [C, T] (dim 0 contiguous, any column stride); the tokens are n_seqs sequences of
    T / n_seqs consecutive columns. weight: F32 [K, C] contiguous (GGUF ssm_conv1d.weight).
    state: F32 view ne (C, K-1, n_slots), dim 0 contiguous, tap 0 the oldest input, any tap and
    slot strides; updated in place. slots: I32 [n_seqs], each sequence's slot (distinct, < n_slots).
    Per sequence and channel, over window = [state taps, the sequence's x columns]:
    out[c, t_i] = silu(sum_k weight[k, c] * window[i + k]); the state then holds the window's
    last K-1 values. out must not overlap x or state.
    """
    op = "ssm_conv"
    channels, n_tokens = x.ne[0], x.ne[1]
    n_kernel = weight.ne[0]
    if x.ne[2] * x.ne[3] != 1:
        raise OutOfRange(f"{op}: x must be 2-D [channels, tokens], got {list(x.ne)}")
    same_shape(x, out, f"{op} out")
    if not 2 <= n_kernel <= MAX_KERNEL or weight.ne[1:] != (channels, 1, 1) or not weight.is_contiguous():
        raise OutOfRange(f"{op}: weight must be a contiguous [K, {channels}] with 2 <= K <= {MAX_KERNEL}, "
                         f"got {weight!r}")
    if state.ne[:2] != (channels, n_kernel - 1) or state.ne[3] != 1:
        raise OutOfRange(f"{op}: state must have ne ({channels}, {n_kernel - 1}, n_slots), got {list(state.ne)}")
    if n_seqs < 1 or n_tokens % n_seqs:
        raise OutOfRange(f"{op}: {n_tokens} tokens do not split into {n_seqs} sequences of equal length")
    if slots.type is not I32 or slots.nelements != n_seqs or not slots.is_contiguous():
        raise GGMLTypeError(f"{op}: slots must be a contiguous I32 tensor of {n_seqs}, got {slots!r}")
    for a, b, what in ((out, x, "x"), (out, state, "state"), (state, x, "x")):
        if a.overlaps(b):
            raise OutOfRange(f"{op}: {a!r} overlaps {what} {b!r}")
    xr, xo, xs = f32_binding(x, f"{op} x")
    yr, yo, ys = f32_binding(out, f"{op} out")
    wr, wo, _ = f32_binding(weight, f"{op} weight")
    sr, so, ss = f32_binding(state, f"{op} state")
    qr, qo = bind_tensor(slots, "ssm_conv slots")

    dev = seq.device
    seq_len = n_tokens // n_seqs
    chunk = max(dev.tuning.ssm_conv_chunk, n_kernel - 1)
    n_chunks = ceil_div(seq_len, chunk)
    n = channels * n_chunks * n_seqs
    k = kernel(dev, "ssm_conv", defines={"K": n_kernel}, push=SSM_CONV_PUSH, workgroup=(dev.tuning.wg_size,))
    push = dict(n=n, channels=channels, seq_len=seq_len, n_chunks=n_chunks, chunk=chunk, x_off=xo, x_s1=xs[0],
                y_off=yo, y_s1=ys[0], w_off=wo, s_off=so, s_s1=ss[0], s_s2=ss[1], slot_off=qo // 4)
    seq.dispatch(k, [xr, wr, sr, qr, yr], push=push, groups=groups_for(k, n), label=op)
