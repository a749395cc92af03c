"""Page-aligned anonymous memory, file regions copied into it, and importing them."""

import numpy as np
import pytest

from vkrt.commands import Uploader, download
from vkrt.errors import OutOfRange
from vkrt.memory import Buffer, HostRegistry
from vkrt.memory.anonymous import PAGE, AnonymousMemory, AnonymousRegion


def test_reads_region_page_aligned(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.tobytes())
    seen = []
    with AnonymousRegion(path, 7, 90_001, chunk=4096, progress=seen.append) as region:
        assert region.address % PAGE == 0
        np.testing.assert_array_equal(region.array, data[7:7 + 90_001])
        assert sum(seen) == 90_001
    with pytest.raises(OutOfRange, match="outside the file"):
        AnonymousRegion(path, 100_000, 10)


def test_anonymous_memory_is_zeroed_and_page_aligned():
    with AnonymousMemory(3 * PAGE + 5, "scratch") as mem:
        assert mem.address % PAGE == 0 and mem.size == 3 * PAGE + 5
        assert mem.array.size == mem.size and not mem.array.any()
        mem.array[-1] = 7
    assert mem.closed and mem.array is None
    mem.close()  # idempotent
    with pytest.raises(OutOfRange, match="negative"):
        AnonymousMemory(-1)


def test_a_region_imports_where_the_file_mapping_might_not(device, tmp_path):
    if not device.profile.host_import:
        pytest.skip("the device lacks VK_EXT_external_memory_host")
    data = np.random.default_rng(1).integers(0, 256, 3 * 65536 + 11, dtype=np.uint8)
    path = tmp_path / "model.gguf"
    path.write_bytes(b"header" + data.tobytes())
    with AnonymousRegion(path, 6) as region, HostRegistry(device, chunk_size=65536, enabled=True) as registry:
        registered = registry.register(region)
        assert registered.stats.bytes_imported == data.size and registered.stats.chunks == 4
        assert registered.label == f"anonymous copy of {path}"
        with Uploader(device, registry=registry) as up, Buffer(device, data.size) as dst:
            up.upload(dst.range(), region.array).wait()
            assert up.stats.bytes_direct == data.size
            np.testing.assert_array_equal(download(device, dst.range()), data)
        registry.unregister(registered)
