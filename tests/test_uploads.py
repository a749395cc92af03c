"""Uploads: every path (staging, imported, fallback copy, host write) byte-exact at odd sizes and
offsets; asynchronous uploads handed to compute; the compute and transfer queues."""

import json
from pathlib import Path

import numpy as np
import pytest

from file_modules import load
from vkrt.commands import CommandSequence, Upload, Uploader, download, upload, upload_async, uploader
from vkrt.errors import OutOfRange, VkrtError
from vkrt.memory import Buffer, HostRegistry, MemoryKind, allocate
from vkrt.memory.anonymous import AnonymousMemory

CHUNK = 64 << 10
SIZE = 3 * CHUNK + 333
CASES = [(1, 0, 0), (3, 5, 1), (4097, 1, 4095), (CHUNK, 12, CHUNK - 100), (CHUNK + 7, 3, 11)]


@pytest.fixture
def host():
    with AnonymousMemory(SIZE, "upload source") as mem:
        mem.array[:] = np.random.default_rng(8).integers(0, 256, SIZE, dtype=np.uint8)
        yield mem


def _source(device, path, host, registry):
    if path in ("imported", "fallback"):
        if not device.profile.host_import:
            pytest.skip("the device lacks VK_EXT_external_memory_host")
        region = registry.register(host, fail_imports_after=0 if path == "fallback" else None)
        assert all(c.imported == (path == "imported") for c in region.chunks)
    return host.array


@pytest.mark.parametrize("queue", ["transfer", "compute"])
@pytest.mark.parametrize("path", ["staged", "imported", "fallback", "host written"])
def test_each_path_is_byte_exact(device, path, queue, host):
    kind = MemoryKind.HOST if path == "host written" else MemoryKind.DEVICE
    with HostRegistry(device, chunk_size=CHUNK, enabled=True) as registry, \
            Uploader(device, queue, segment_size=8192, segments=2, registry=registry) as up, \
            Buffer(device, SIZE + 64, kind) as dst:
        src = _source(device, path, host, registry)
        for size, dst_offset, src_offset in CASES:
            expect = src[src_offset:src_offset + size]
            upload(device, dst.range(dst_offset, size), ~expect)  # every byte differs before the upload
            handle = up.upload(dst.range(dst_offset, size), expect)
            handle.wait()
            assert handle.done()
            np.testing.assert_array_equal(download(device, dst.range(dst_offset, size)), expect)
        total = sum(c[0] for c in CASES)
        moved = {"staged": up.stats.bytes_staged, "imported": up.stats.bytes_direct,
                 "fallback": up.stats.bytes_direct, "host written": up.stats.bytes_host_written}
        assert moved[path] == total
        assert up.stats.bytes_staged + up.stats.bytes_direct + up.stats.bytes_host_written == total


def test_registered_source_straddling_chunks_is_one_submission(device, host):
    if not device.profile.host_import:
        pytest.skip("the device lacks VK_EXT_external_memory_host")
    with HostRegistry(device, chunk_size=CHUNK, enabled=True) as registry, \
            Uploader(device, registry=registry) as up, Buffer(device, SIZE) as dst:
        registry.register(host)
        assert registry.lookup(host.address + 10, SIZE - 20) is None
        up.upload(dst.range(0, SIZE - 20), host.array[10:SIZE - 10]).wait()
        assert up.stats.submissions == 1 and up.stats.bytes_direct == SIZE - 20
        np.testing.assert_array_equal(download(device, dst.range(0, SIZE - 20)), host.array[10:SIZE - 10])


def test_async_upload_hands_off_to_compute(device):
    n = 5000
    a = np.random.default_rng(0).integers(0, 1 << 30, n, dtype=np.int32)
    b = np.random.default_rng(1).integers(0, 1 << 30, n, dtype=np.int32)
    with Buffer(device, 4 * n) as x, Buffer(device, 4 * n) as y, Buffer(device, 8 * n) as out, \
            CommandSequence(device) as seq:
        first = upload_async(device, x, a)
        second = upload_async(device, y.range(), b)
        assert isinstance(second, Upload) and second.value >= first.value
        semaphore, value = second  # a (semaphore, value) pair, as CommandSequence.submit takes
        assert semaphore is device.transfer.timeline
        with seq.record():
            seq.copy(x.range(), out.range(0, 4 * n))
            seq.copy(y.range(), out.range(4 * n, 4 * n))
        seq.submit(waits=[first, second])
        seq.wait()
        np.testing.assert_array_equal(download(device, out, np.int32), np.concatenate([a, b]))


def test_upload_waits_for_earlier_compute_work(device):
    n = 1 << 16
    old = np.arange(n, dtype=np.int32)
    with Buffer(device, 4 * n) as y, Buffer(device, 4 * n) as z, CommandSequence(device) as seq:
        upload(device, y, old)
        with seq.record():
            for _ in range(20):
                seq.copy(y.range(), z.range())
                seq.barrier()
        seq.submit()
        upload_async(device, y, np.zeros(n, np.int32)).wait()  # must not overtake the copies reading y
        seq.wait()
        np.testing.assert_array_equal(download(device, z, np.int32), old)
        np.testing.assert_array_equal(download(device, y, np.int32), np.zeros(n, np.int32))


def test_shared_uploaders_and_queues(device):
    assert uploader(device) is uploader(device)
    assert uploader(device).queue is device.transfer and uploader(device, "compute").queue is device.compute
    with pytest.raises(VkrtError, match="'transfer' or 'compute'"):
        Uploader(device, "graphics")


def test_upload_and_download_keep_their_semantics(device):
    data = np.arange(1000, dtype=np.int32)
    a = allocate(device, data.nbytes, label="legacy")
    try:
        upload(device, a, data)  # an Allocation is a range too
        np.testing.assert_array_equal(download(device, a, np.int32), data)
        for kind in MemoryKind:
            with Buffer(device, 4003, kind) as buf:
                upload(device, buf.range(3, 4000), data)
                np.testing.assert_array_equal(download(device, buf.range(3, 4000), np.int32), data)
        with Buffer(device, 16) as small:
            with pytest.raises(OutOfRange, match="do not fit"):
                upload(device, small, np.zeros(5, np.float32))
            upload(device, small, b"")  # nothing to do
        closed = Buffer(device, 16)
        closed.close()
        with pytest.raises(VkrtError, match="closed"):
            upload(device, closed, b"1234")
    finally:
        a.close()


def test_bench_h2d_reports_every_path(device):
    from click.testing import CliRunner

    from vkrt.cli.main import cli

    result = CliRunner().invoke(cli, ["bench-h2d", "--max-size", "1M", "--queue", "transfer", "--iters", "1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["sizes_bytes"] == [1 << 20] and out["cuda"] is None and "bench/h2d.py" in out["cuda_not_measured"]
    assert (out["device"], out["architecture"]) == (device.profile.name, device.profile.architecture.value)
    paths = {r["path"] for r in out["results"]}
    assert paths == {"staging", "imported", "mmap", "fallback", "naive"}
    assert all(r["gbps"] > 0 and r["queue"] == "transfer" for r in out["results"])
    assert out["registrations"]["mmap"]["path"] in ("import", "fallback", "mixed")
    assert out["registrations"]["anonymous"]["path"] == ("import" if device.profile.host_import else "unregistered")
    assert out["registrations"]["fallback"]["path"] == "fallback"
    assert out["summary"]["staging_transfer_speedup_vs_naive"] > 0


def _fake_libcuda(calls: list, init_result: int = 0):
    """Functions standing in for libcuda.so.1 (plain functions, so _declare can set argtypes)."""
    import ctypes
    import types

    keep = []

    def alloc(ref, size):
        buf = (ctypes.c_char * size)()
        keep.append(buf)
        ref._obj.value = ctypes.addressof(buf)
        return 0

    def record(name, result=0):
        def fn(*args):
            calls.append((name, args))
            return result
        return fn

    def device_get(ref, ordinal):
        ref._obj.value = ordinal
        return 0

    def get_name(buf, n, dev):
        buf.value = b"Fake GPU"
        return 0

    def ctx_retain(ref, dev):
        ref._obj.value = 1234
        return 0

    def copy(dst, src, size):
        ctypes.memmove(dst, src, size)
        calls.append(("copy", (size, ctypes.string_at(dst, size) == b"\1" * size)))
        return 0

    return types.SimpleNamespace(
        cuInit=record("init", init_result), cuDeviceGet=device_get, cuDeviceGetName=get_name,
        cuDevicePrimaryCtxRetain=ctx_retain, cuDevicePrimaryCtxRelease_v2=record("release"),
        cuCtxSetCurrent=record("set"), cuCtxSynchronize=record("sync"), cuMemAlloc_v2=alloc,
        cuMemFree_v2=record("free"), cuMemAllocHost_v2=alloc, cuMemFreeHost=record("free host"),
        cuMemcpyHtoD_v2=copy)


def test_bench_script_adds_the_cuda_reference(device, tmp_path):
    """bench/h2d.py: bench-h2d's measurement with the CUDA peer (bench/cuda_h2d.py) beside it."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "bench" / "h2d.py"), "--max-size", "1M", "--queue", "compute",
                           "--iters", "1", "--tmpdir", str(tmp_path), "--no-cuda", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cuda"] is None and out["cuda_not_measured"] == "skipped (--no-cuda)"
    assert {r["queue"] for r in out["results"]} == {"compute"}


def _bench_module(name: str):
    return load("bench", name)


def test_cuda_reference_through_the_driver(monkeypatch):
    import ctypes

    cuda_h2d = _bench_module("cuda_h2d")

    calls = []
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _fake_libcuda(calls))
    sizes = [4096, 8192]
    result, why = cuda_h2d._with_driver(sizes, lambda copy, size: (copy(), 1e-3)[1])
    assert why == "" and result["via"] == "libcuda" and result["device"] == "Fake GPU"
    assert [r["size_bytes"] for r in result["pinned"]] == sizes and result["pageable"][1]["gbps"] == 8192 / 1e-3 / 1e9
    copies = [args for name, args in calls if name == "copy"]
    assert copies == [(4096, True), (8192, True)] * 2  # pinned then pageable, every byte arrived
    assert {"free", "free host", "release"} <= {name for name, _ in calls}
    calls.clear()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _fake_libcuda(calls, init_result=100))
    result, why = cuda_h2d._with_driver(sizes, lambda copy, size: 1.0)
    assert result is None and "cuInit returned CUresult 100" in why
    assert not {"free", "free host", "release"} & {name for name, _ in calls}
