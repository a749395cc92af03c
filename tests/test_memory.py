"""Buffers, memory kinds, suballocation, and the out-of-memory error."""

import numpy as np
import pytest

from vkrt.commands import download, upload
from vkrt.device.vk import vk
from vkrt.errors import OutOfDeviceMemory, VkrtError
from vkrt.memory import Allocator, Buffer, MemoryKind


@pytest.mark.parametrize("kind", list(MemoryKind))
def test_upload_download_roundtrip(device, kind):
    data = np.random.default_rng(1).integers(0, 255, 1001, dtype=np.uint8)
    with Buffer(device, 1001 + 37, kind, label=f"rt-{kind.value}") as buf:
        upload(device, buf.range(37, 1001), data)
        np.testing.assert_array_equal(download(device, buf.range(37, 1001)), data)


def test_host_buffer_write_read(device):
    with Buffer(device, 64, MemoryKind.HOST) as buf:
        buf.write(np.arange(16, dtype=np.float32))
        np.testing.assert_array_equal(buf.read(np.float32), np.arange(16, dtype=np.float32))
        with pytest.raises(ValueError, match="overruns"):
            buf.write(b"x" * 65)


def test_bad_sizes(device):
    with pytest.raises(ValueError, match="positive"):
        Buffer(device, 0)
    with pytest.raises(VkrtError, match="maximum buffer size"):
        Buffer(device, device.profile.max_buffer_size + 1)


def test_suballocation_shares_blocks_and_reuses_space(device):
    with Allocator(device, MemoryKind.DEVICE, block_size=1 << 20) as alloc:
        a = alloc.alloc(1000, "a")
        b = alloc.alloc(3000, "b")
        assert a.buffer is b.buffer
        align = alloc.alignment
        assert a.offset % align == 0 and b.offset % align == 0
        assert b.offset >= a.offset + a.size
        first = a.offset
        a.close()
        a.close()  # idempotent
        c = alloc.alloc(900, "c")
        assert c.offset == first  # freed space is reused
        big = alloc.alloc(900_000, "big")  # over half a block: dedicated buffer
        assert big.buffer is not b.buffer and big.offset == 0
        assert alloc.stats()["blocks"] == 2
        big.close()
        assert alloc.stats()["blocks"] == 1
        b.close()
        c.close()
        assert alloc.stats()["used"] == 0


def test_allocations_do_not_overlap(device):
    rng = np.random.default_rng(7)
    with Allocator(device, MemoryKind.DEVICE, block_size=1 << 20) as alloc:
        live = []
        for _ in range(200):
            if live and rng.random() < 0.4:
                live.pop(rng.integers(len(live))).close()
            else:
                live.append(alloc.alloc(int(rng.integers(1, 20000)), "r"))
            spans = sorted((id(x.buffer), x.offset, x.offset + x.size) for x in live)
            for (k1, _, e1), (k2, s2, _) in zip(spans, spans[1:]):
                assert k1 != k2 or e1 <= s2
        for x in live:
            x.close()
        assert alloc.stats()["used"] == 0


def test_out_of_memory_names_request_and_heap(device, monkeypatch):
    def refuse(*args, **kw):
        raise vk.VkErrorOutOfDeviceMemory()
    monkeypatch.setattr(vk, "vkAllocateMemory", refuse)
    before = list(device.heap_used)
    with pytest.raises(OutOfDeviceMemory) as info:
        Buffer(device, 3 << 20, label="kv cache")
    msg = str(info.value)
    assert "3.0 MiB" in msg and "'kv cache'" in msg and "heap" in msg and "already uses" in msg
    assert isinstance(info.value, MemoryError)
    assert device.heap_used == before
