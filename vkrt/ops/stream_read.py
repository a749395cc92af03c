"""The bandwidth probe: a compute shader streaming a buffer (shaders/stream_read.comp), the peer
against which bench/matmul.py reads a mat-vec's weight bandwidth. On the H200 a buffer copy
(vkCmdCopyBuffer) moved ~850 GB/s while this read 4.4-4.6 TB/s, as CUDA does."""

from __future__ import annotations

from ..errors import OutOfRange
from ..pipeline import PushConstants, kernel

STREAM_PUSH = PushConstants(("n", "u32"))
UNROLL = 4            # uvec4 loads in flight an invocation (H200: 1 to 8 within 4%, from 1056 workgroups)
GROUPS_PER_CU = 8     # workgroups of 256 a compute unit (H200: 2 a CU 2.4 TB/s, 8 4.5 TB/s)


def stream_groups(device, wg: int) -> int:
    """Workgroups of `wg` invocations that keep every compute unit streaming."""
    cus = device.profile.compute_units or 128
    return max(1, GROUPS_PER_CU * cus * 256 // wg)


def stream_dst_bytes(device, groups: int | None = None) -> int:
    """Bytes stream_read stores: a word for each invocation of its grid."""
    wg = device.tuning.wg_size
    return 4 * (groups or stream_groups(device, wg)) * wg


def stream_read(seq, src, dst, *, groups: int | None = None) -> int:
    """Record the probe over buffer range `src` (a multiple of 16 bytes): invocation t of the
    grid stores into 32-bit word t of range `dst` the xor of the uvec4s t, t + T, t + 2T, ...
    (T invocations in all), each folded to one word. Returns T."""
    dev = seq.device
    wg = dev.tuning.wg_size
    groups = groups or stream_groups(dev, wg)
    total = groups * wg
    if src.size % 16 or src.size // 16 >= 1 << 32:
        raise OutOfRange(f"stream_read: the source must be whole 16-byte words, fewer than 2^32; got {src.size} bytes")
    if dst.size < 4 * total:
        raise OutOfRange(f"stream_read: {total} invocations store {4 * total} bytes, the destination holds {dst.size}")
    k = kernel(dev, "stream_read", defines={"UNROLL": UNROLL}, push=STREAM_PUSH, workgroup=(wg,))
    seq.dispatch(k, [src, dst], push={"n": src.size // 16}, groups=(groups, 1, 1), label="stream_read")
    return total
