"""Staging ring: round-robin reuse, waiting for a segment's last copy, streaming any size."""

import threading

import numpy as np
import pytest

from vkrt.commands import Uploader, download
from vkrt.commands.staging_ring import THREADED_COPY_MIN, StagingRing
from vkrt.device.queue import TimelineSemaphore
from vkrt.device.vk import vk
from vkrt.errors import OutOfRange
from vkrt.memory import Buffer, MemoryKind
from vkrt.owned import live_objects

SEGMENT = 8192


def test_segments_are_handed_out_round_robin(device):
    with StagingRing(device, device.transfer, SEGMENT, 3) as ring:
        assert [ring.acquire() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
        assert ring.acquired == 7
        spans = [(ring.segment(i).offset, ring.segment(i).size) for i in range(3)]
        assert spans == [(0, SEGMENT), (SEGMENT, SEGMENT), (2 * SEGMENT, SEGMENT)]
        assert ring.buffer.kind is MemoryKind.HOST and ring.buffer.host_visible


def test_a_segment_is_reused_only_after_its_copy_finished(device):
    n = 2 * SEGMENT
    with TimelineSemaphore(device, label="gate") as gate, Buffer(device, n) as dst, \
            Uploader(device, segment_size=SEGMENT, segments=2) as up:  # closed first: waits for its copies
        try:
            pending = up.upload(dst.range(), np.full(n, 5, np.uint8), waits=[(gate, 1)])  # both segments
            got = []
            waiter = threading.Thread(target=lambda: got.append(up.ring.acquire()))
            waiter.start()
            waiter.join(0.3)
            assert not got and not pending.done()  # segment 0 still holds a copy that has not run
        finally:
            vk.vkSignalSemaphore(device.handle, vk.VkSemaphoreSignalInfo(semaphore=gate.handle, value=1))
        waiter.join(30)
        assert got == [0] and up.queue.done(up.ring.busy_until(0))
        up.ring.release(0, 0)
        pending.wait()
        np.testing.assert_array_equal(download(device, dst.range()), np.full(n, 5, np.uint8))


@pytest.mark.parametrize("size,dst_offset,src_offset", [(1, 0, 0), (4095, 3, 1), (SEGMENT, 0, 0),
                                                        (SEGMENT + 1, 13, 7), (5 * SEGMENT + 4097, 1, 3)])
def test_streams_uploads_of_any_size(device, size, dst_offset, src_offset):
    data = np.random.default_rng(size).integers(0, 256, size + src_offset, dtype=np.uint8)
    with Uploader(device, segment_size=SEGMENT, segments=3) as up, Buffer(device, size + dst_offset + 5) as dst:
        before = up.ring.acquired
        up.upload(dst.range(dst_offset, size), data[src_offset:]).wait()
        assert up.ring.acquired - before == -(-size // SEGMENT)
        assert up.stats.bytes_staged == size and up.stats.submissions == -(-size // SEGMENT)
        np.testing.assert_array_equal(download(device, dst.range(dst_offset, size)), data[src_offset:])


def test_no_allocation_per_upload(device):
    data = np.arange(10 * SEGMENT // 4, dtype=np.uint32)
    with Uploader(device, segment_size=SEGMENT, segments=2) as up, Buffer(device, data.nbytes) as dst:
        up.upload(dst.range(), data).wait()
        ring_buffer = up.ring.buffer
        counts = live_objects()
        for k in range(5):
            up.upload(dst.range(), data + k).wait()
        assert live_objects() == counts and up.ring.buffer is ring_buffer
        np.testing.assert_array_equal(download(device, dst.range(), np.uint32), data + 4)


def test_threaded_fill(device):
    size = THREADED_COPY_MIN + 12345
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    with StagingRing(device, device.transfer, size, 2, copy_threads=3) as ring:
        ring.fill(1, data)
        np.testing.assert_array_equal(ring.buffer.host_bytes[ring.segment_size:ring.segment_size + size], data)
        with pytest.raises(OutOfRange, match="do not fit"):
            ring.fill(0, np.zeros(ring.segment_size + 1, np.uint8))


def test_downloads_stream_through_a_readback_ring(device):
    size = 4 * SEGMENT + 999
    data = np.random.default_rng(4).integers(0, 256, size, dtype=np.uint8)
    with Uploader(device, segment_size=SEGMENT, segments=2) as up, Buffer(device, size + 11) as src:
        up.upload(src.range(11, size), data).wait()
        got = up.download(src.range(11, size))
        np.testing.assert_array_equal(got, data)
        ring = up.readback_ring
        assert ring.buffer.kind is MemoryKind.READBACK and ring.acquired == -(-size // SEGMENT)
        np.testing.assert_array_equal(up.download(src.range(11, 400), np.uint32), data[:400].view(np.uint32))


def test_bad_ring_shapes(device):
    with pytest.raises(OutOfRange, match="at least 2 segments"):
        StagingRing(device, device.transfer, SEGMENT, 1)
    with pytest.raises(OutOfRange, match="at least 2 segments"):
        StagingRing(device, device.transfer, 100, 4)
