"""The conv windows of a Gated DeltaNet catch-up (RecurrentState.catch_up): a speculative step
taken back part way brings each layer's ssm_conv window forward from the snapshot over the
step's kept inputs, for a span (first kept column, tokens) read on the device, so that one
recorded catch-up serves every span."""

from __future__ import annotations

from ..errors import GGMLTypeError, OutOfRange
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor, f32_binding
from .grid import ceil_div

WINDOW_PUSH = PushConstants(
    ("channels", "u32"), ("taps", "u32"), ("out_off", "u32"), ("out_s1", "u32"), ("out_s2", "u32"),
    ("snap_off", "u32"), ("snap_s1", "u32"), ("snap_s2", "u32"), ("kept_off", "u32"), ("kept_s1", "u32"),
    ("kept_s2", "u32"), ("span_off", "u32"))



def catch_up_windows(seq, out: Tensor, snapshot: Tensor, kept: Tensor, span: Tensor) -> None:
    """Record, for every layer l, the conv window of a sequence `count` tokens past its snapshot:
    out[:, j, l] = window position w = count + j of [snapshot[:, :, l], kept[:, first:, l]]
    (snapshot[:, w, l] while w < taps, else kept[:, first + w - taps, l]).

    out, snapshot: F32 [C, taps, L] (the layers' conv states of one slot, tap 0 the oldest, and
    the snapshot's); kept: F32 [C, columns, L] (a step's ssm_conv inputs); dim 0 contiguous, any
    other strides. span: I32 [3] (slot, first, count), read on the device: count >= 1 and
    first + count <= columns are the caller's to keep. out must not overlap the inputs.
    """
    op = "catch_up_windows"
    channels, taps, layers = out.ne[0], out.ne[1], out.ne[2]
    if out.ne[3] != 1 or snapshot.ne != out.ne:
        raise OutOfRange(f"{op}: out and snapshot must both be [C, taps, layers], got {list(out.ne)} and "
                         f"{list(snapshot.ne)}")
    if kept.ne[0] != channels or kept.ne[2:] != (layers, 1):
        raise OutOfRange(f"{op}: kept must be [{channels}, columns, {layers}], got {list(kept.ne)}")
    if span.type is not I32 or span.nelements != 3 or not span.is_contiguous():
        raise GGMLTypeError(f"{op}: span must be a contiguous I32 tensor of 3 (slot, first, count), got {span!r}")
    for other, what in ((snapshot, "snapshot"), (kept, "kept"), (span, "span")):
        if out.overlaps(other):
            raise OutOfRange(f"{op}: out {out!r} overlaps {what} {other!r}")
    orr, oo, os_ = f32_binding(out, f"{op} out")
    sr, so, ss = f32_binding(snapshot, f"{op} snapshot")
    kr, ko, ks = f32_binding(kept, f"{op} kept")
    pr, po = bind_tensor(span, f"{op} span")
    dev = seq.device
    k = kernel(dev, "gdn_catch_up_window", push=WINDOW_PUSH, workgroup=(dev.tuning.wg_size,))
    groups = ceil_div(channels * taps, k.workgroup[0])
    if groups > dev.profile.max_workgroup_count[0] or layers > dev.profile.max_workgroup_count[1]:
        raise OutOfRange(f"{op}: {channels} x {taps} window elements over {layers} layers exceed the device's "
                         f"workgroup counts {dev.profile.max_workgroup_count[:2]}")
    push = dict(channels=channels, taps=taps, out_off=oo, out_s1=os_[0], out_s2=os_[1], snap_off=so, snap_s1=ss[0],
                snap_s2=ss[1], kept_off=ko, kept_s1=ks[0], kept_s2=ks[1], span_off=po // 4)
    seq.dispatch(k, [orr, sr, kr, pr], push=push, groups=(groups, layers, 1), label=op)
