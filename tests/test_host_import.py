"""Host registry: chunked imports, fallback copies, look-ups, statistics, unregister, opt-out."""

import dataclasses
import logging
import mmap
import threading

import numpy as np
import pytest

from vkrt.commands import CommandSequence, Uploader, download, read_tensor
from vkrt.device.queue import TimelineSemaphore
from vkrt.device.vk import ffi, vk
from vkrt.errors import ConfigError, HostImportError, VkrtError
from vkrt.memory import F32, Buffer, HostRegistry, ImportedBuffer, Tensor
from vkrt.memory.anonymous import AnonymousMemory
from vkrt.units import parse_size
from vkrt.ops.elementwise import add

CHUNK = 64 << 10
SIZE = 5 * CHUNK + 3 * 4096 + 777  # six chunks, the last one partial and unaligned at the end


@pytest.fixture(autouse=True)
def _needs_import(device):
    if not device.profile.host_import:
        pytest.skip("the device lacks VK_EXT_external_memory_host")


@pytest.fixture
def memory():
    with AnonymousMemory(SIZE, "test memory") as mem:
        mem.array[:] = np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8)
        yield mem


@pytest.fixture
def registry(device):
    with HostRegistry(device, chunk_size=CHUNK, enabled=True) as reg:
        yield reg


def gpu_read(device, ranges) -> np.ndarray:
    """The bytes the GPU reads from `ranges` (copied into VRAM by a command sequence)."""
    total = sum(r.size for r in ranges)
    with Buffer(device, total, label="gpu read") as out, CommandSequence(device) as seq:
        with seq.record():
            at = 0
            for r in ranges:
                seq.copy(r, out.range(at, r.size))
                at += r.size
        seq.run()
        return download(device, out.range(0, total))


def check_all(device, registry, host: np.ndarray) -> None:
    """Odd-sized ranges at odd offsets inside each chunk, and ranges straddling chunk borders,
    read back exactly as the host has them."""
    base = host.ctypes.data
    region = next(r for r in registry.regions if r.address <= base < r.end)
    for chunk in region.chunks:
        lo, hi = chunk.start - base, chunk.end - base
        for off, size in ((lo, 1), (lo + 1, min(4095, hi - lo - 1)), (lo + 3, hi - lo - 3), (hi - 7, 7)):
            rng = registry.lookup(base + off, size)
            assert rng is not None and rng.buffer is chunk.buffer, (off, size)
            np.testing.assert_array_equal(gpu_read(device, [rng]), host[off:off + size])
    borders = [c.start - base for c in region.chunks[1:]]
    cases = [(b - 5, 10) for b in borders] + [(borders[0] - 1, borders[1] - borders[0] + 2), (7, host.size - 7)]
    for off, size in cases:
        assert registry.lookup(base + off, size) is None  # straddles: the caller stages it
        spans = registry.spans(base + off, size)
        assert len(spans) >= 2 and sum(s.size for s in spans) == size
        np.testing.assert_array_equal(gpu_read(device, spans), host[off:off + size])


def test_chunks_are_aligned_and_imported(device, registry, memory):
    region = registry.register(memory)
    align = device.profile.host_import_alignment
    s = region.stats
    assert s.chunks == len(region.chunks) == 6 and s.imported_chunks == 6 and s.copied_chunks == 0
    assert s.bytes_imported == s.bytes_registered == SIZE and s.bytes_copied == s.bytes_uncovered == 0
    assert not s.failures
    for i, chunk in enumerate(region.chunks):
        assert isinstance(chunk.buffer, ImportedBuffer) and chunk.imported
        assert chunk.base % align == 0 and chunk.buffer.size % align == 0 and chunk.buffer.size <= CHUNK
        assert chunk.start == memory.address + i * CHUNK
    assert region.chunks[-1].end == memory.address + SIZE
    check_all(device, registry, memory.array)


def test_lookup_offsets_inside_a_chunk(registry, memory):
    region = registry.register(memory)
    rng = registry.lookup(memory.address + 2 * CHUNK + 21, 100)
    assert rng.buffer is region.chunks[2].buffer and rng.offset == 21 and rng.size == 100
    assert region.lookup(memory.address + 2 * CHUNK + 21, 100) == rng
    assert registry.lookup(memory.address - 1, 2) is None
    assert registry.lookup(memory.address + SIZE, 1) is None
    assert registry.lookup(memory.address + SIZE - 1, 2) is None
    assert registry.spans(memory.address + SIZE - 1, 2) is None
    for off in range(0, SIZE, 4099):
        assert region.lookup(memory.address + off, 9) == registry.lookup(memory.address + off, 9)
    other = np.ones(3 * CHUNK, np.uint8)
    registry.register(other)
    assert registry.lookup(other.ctypes.data + CHUNK, 4) is not None
    assert region.lookup(other.ctypes.data + CHUNK, 4) is None  # another region's bytes


def test_forced_import_failure_copies_that_chunk_and_the_rest(device, registry, memory):
    region = registry.register(memory, fail_imports_after=2)
    s = region.stats
    assert [c.imported for c in region.chunks] == [True, True, False, False, False, False]
    assert s.imported_chunks == 2 and s.copied_chunks == 4 and s.chunks == 6
    assert s.bytes_imported == 2 * CHUNK and s.bytes_imported + s.bytes_copied == SIZE
    assert len(s.failures) == 1 and "chunk 2" in s.failures[0]
    for chunk in region.chunks[2:]:
        assert not isinstance(chunk.buffer, ImportedBuffer) and chunk.buffer.host_visible
    check_all(device, registry, memory.array)
    memory.array[:] = 0  # the fallback copies were made once and keep the bytes they copied
    assert gpu_read(device, [registry.lookup(memory.address + 3 * CHUNK, 16)]).any()


def test_driver_refusal_is_reported_with_its_error(device, registry, memory, monkeypatch):
    real = vk.vkAllocateMemory

    def refuse_imports(dev, info, alloc):
        if info.pNext != ffi.NULL:
            raise vk.VkErrorOutOfDeviceMemory()
        return real(dev, info, alloc)
    monkeypatch.setattr(vk, "vkAllocateMemory", refuse_imports)
    region = registry.register(memory)
    s = region.stats
    assert s.imported_chunks == 0 and s.copied_chunks == 6 and s.bytes_copied == SIZE
    assert "VK_ERROR_OUT_OF_DEVICE_MEMORY" in s.failures[0]
    monkeypatch.undo()
    check_all(device, registry, memory.array)


def test_file_backed_mmap(device, registry, tmp_path):
    size = 3 * CHUNK + 123
    data = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        region = registry.register(mapped, label="weights mmap")
        s = region.stats
        assert s.chunks == 4 and s.bytes_imported + s.bytes_copied == size and s.bytes_uncovered == 0
        view = np.frombuffer(mapped, dtype=np.uint8)
        check_all(device, registry, view)
        del view
        registry.unregister(region)
        mapped.close()  # the registry let go of the mapping: no BufferError
        assert mapped.closed


def test_unaligned_region_inside_pages(device, registry):
    backing = np.random.default_rng(9).integers(0, 256, 5 * CHUNK, dtype=np.uint8)
    host = backing[1001:1001 + 3 * CHUNK + 5]
    region = registry.register(host)
    assert region.chunks[0].start == host.ctypes.data and region.chunks[0].base < host.ctypes.data
    assert registry.lookup(host.ctypes.data - 1, 1) is None  # imported page, but not registered bytes
    check_all(device, registry, host)


def test_unregister_releases_and_later_use_is_an_error(device, registry, memory):
    region = registry.register(memory)
    rng = registry.lookup(memory.address + 100, 64)
    buffers = [c.buffer for c in region.chunks]
    registry.unregister(region)
    assert all(b.closed for b in buffers) and not registry.regions
    assert registry.lookup(memory.address + 100, 64) is None
    with pytest.raises(HostImportError, match="unregistered"):
        region.lookup(memory.address + 100, 64)
    with pytest.raises(HostImportError, match="released"):
        rng.buffer.host_bytes
    with Buffer(device, 64) as out, CommandSequence(device) as seq:
        with pytest.raises(VkrtError, match="closed"):
            with seq.record():
                seq.copy(rng, out.range())
    with pytest.raises(VkrtError, match="closed"):
        Uploader(device, registry=registry).copy(rng, Buffer(device, 64).range())
    registry.unregister(region)  # idempotent
    with pytest.raises(HostImportError, match="no registered host range"):
        registry.unregister(memory.address)
    assert registry.stats().regions == 0


def test_unregister_by_address_waits_for_gpu_reads(device, registry, memory):
    chunks = registry.register(memory).chunks
    with TimelineSemaphore(device, label="gate") as gate, Buffer(device, SIZE) as dst, \
            Uploader(device, registry=registry) as up:  # closed first: waits for its copies
        try:
            pending = up.upload(dst.range(), memory.array, waits=[(gate, 1)])  # held back by the gate
            assert up.stats.bytes_direct == SIZE
            done = threading.Event()
            waiter = threading.Thread(target=lambda: (registry.unregister(memory.address), done.set()))
            waiter.start()
            assert not done.wait(0.3)  # the copy out of the imported memory has not run yet
            assert not any(c.buffer.closed for c in chunks)
            assert registry.lookup(memory.address, 1) is None  # no new users while it waits
        finally:
            vk.vkSignalSemaphore(device.handle, vk.VkSemaphoreSignalInfo(semaphore=gate.handle, value=1))
        waiter.join(30)
        assert done.is_set() and pending.done() and not registry.regions
        assert all(c.buffer.closed for c in chunks)
        np.testing.assert_array_equal(download(device, dst.range()), memory.array)


def test_memory_outlives_registration(device, registry):
    mem = AnonymousMemory(2 * CHUNK)
    region = registry.register(mem)
    mem.close()  # too early: the registry still holds a view, so the pages stay mapped
    np.testing.assert_array_equal(gpu_read(device, [registry.lookup(region.address, 8)]), np.zeros(8, np.uint8))
    registry.unregister(region)
    with pytest.raises(HostImportError, match="closed"):
        registry.register(mem)


def test_statistics_add_up_and_one_log_line(device, registry, memory, caplog):
    other = np.ones(2 * CHUNK + 11, np.uint8)
    with caplog.at_level(logging.INFO, logger="vkrt"):
        registry.register(memory, fail_imports_after=4)
    lines = [r for r in caplog.records if "registered" in r.getMessage()]
    assert len(lines) == 1 and "imported in 4 chunk(s)" in lines[0].getMessage()
    assert "copied to host-visible buffers in 2 chunk(s)" in lines[0].getMessage()
    assert "refused" in lines[0].getMessage() and lines[0].levelno == logging.WARNING
    registry.register(other)
    s = registry.stats()
    assert s.regions == 2 and s.bytes_registered == SIZE + other.size
    assert s.bytes_imported + s.bytes_copied + s.bytes_uncovered == s.bytes_registered
    assert s.chunks == s.imported_chunks + s.copied_chunks == 6 + 3
    assert s.copied_chunks == 2 and len(s.failures) == 1


def test_overlapping_registration_is_refused(registry, memory):
    registry.register(memory.array[:CHUNK])
    with pytest.raises(HostImportError, match="overlaps"):
        registry.register(memory.array[CHUNK - 1:2 * CHUNK])
    registry.register(memory.array[CHUNK:2 * CHUNK])  # adjacent is fine


def test_opt_out(device, memory, device_env, caplog):
    device_env("VKRT_REGISTER_HOST", "0")
    with HostRegistry(device, chunk_size=CHUNK) as reg, caplog.at_level(logging.INFO, logger="vkrt"):
        region = reg.register(memory)
        assert not region.chunks and region.stats.bytes_uncovered == SIZE and not region.stats.failures
        assert reg.lookup(memory.address, 1) is None and reg.spans(memory.address, 1) is None
        assert "VKRT_REGISTER_HOST=0" in caplog.text
        with Uploader(device, registry=reg) as up, Buffer(device, SIZE) as dst:
            up.upload(dst.range(), memory.array).wait()
            assert up.stats.bytes_staged == SIZE and up.stats.bytes_direct == 0
            np.testing.assert_array_equal(download(device, dst.range()), memory.array)
    device_env("VKRT_REGISTER_HOST", "1")
    with HostRegistry(device, chunk_size=CHUNK, enabled=False) as reg:
        assert not reg.register(memory).chunks


def test_device_without_the_extension_registers_nothing(device, memory, monkeypatch):
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, host_import=False))
    with HostRegistry(device, chunk_size=CHUNK, enabled=True) as reg:
        region = reg.register(memory)
        assert not region.chunks and "lacks VK_EXT_external_memory_host" in region.skipped


def test_chunk_size_setting(device, monkeypatch, device_env):
    device_env("VKRT_IMPORT_CHUNK", "128K")
    with HostRegistry(device) as reg:
        assert reg.chunk_size == 128 << 10
    with pytest.raises(ConfigError, match="VKRT_IMPORT_CHUNK='lots'"):
        device_env("VKRT_IMPORT_CHUNK", "lots")
    monkeypatch.setattr(device, "settings", device.settings.replace(import_chunk=None))
    with HostRegistry(device) as reg:
        p = device.profile
        assert reg.chunk_size <= min(p.max_buffer_size, p.max_allocation_size)
        assert reg.chunk_size % p.host_import_alignment == 0
    assert parse_size("65536", "x") == 65536 and parse_size("64M", "x") == 64 << 20
    assert parse_size("1GiB", "x") == 1 << 30


def test_imported_buffer_needs_alignment(device, memory):
    with pytest.raises(HostImportError, match="multiples"):
        ImportedBuffer(device, memory.address + 1, 4096)
    with ImportedBuffer(device, memory.address, 4096, label="one page") as buf:
        np.testing.assert_array_equal(gpu_read(device, [buf.range()]), memory.array[:4096])
        if buf.host_visible:  # a host-coherent memory type took the import: host_bytes is the memory itself
            assert buf.host_bytes.ctypes.data == memory.address
    assert buf.closed and buf.handle is None and buf.memory is None


def test_tensor_on_an_imported_chunk_binds_in_a_kernel(device, registry):
    n = 3000
    with AnonymousMemory(4 * n) as mem:
        values = np.random.default_rng(2).standard_normal(n).astype(np.float32)
        mem.array[:] = values.view(np.uint8)
        registry.register(mem)
        t = Tensor.on(registry.lookup(mem.address, 4 * n), F32, (n,), name="host weights")
        np.testing.assert_array_equal(read_tensor(t), values)
        with Buffer(device, 4 * n) as out, CommandSequence(device) as seq:
            with seq.record():
                add(seq, t, t, Tensor.on(out.range(), F32, (n,)))  # the kernel reads host memory directly
            seq.run()
            np.testing.assert_array_equal(download(device, out.range(), np.float32), values + values)
