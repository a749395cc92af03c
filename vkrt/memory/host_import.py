"""The host registry: host ranges (a model's mmap, a --no-mmap buffer) made reachable by GPU DMA
(docs/ARCHITECTURE.md §4, host import).

A registered range is imported with VK_EXT_external_memory_host in chunks no larger than the
device allows (and settings.import_chunk, VKRT_IMPORT_CHUNK), each aligned to minImportedHostPointerAlignment. Once an
import fails (file-backed mmap on RADV and NVIDIA) that chunk and the rest are copied once into
host-visible Vulkan buffers instead. lookup(pointer, size) gives the BufferRange holding those
bytes when they lie in one chunk and None when they straddle two (upload those through staging).
settings.register_host (VKRT_REGISTER_HOST=0) turns registration off (every lookup is then None).
"""

from __future__ import annotations

import bisect
import logging
import mmap
import threading
from dataclasses import dataclass, field

import numpy as np

from ..device.vk import ffi
from ..errors import ConfigError, HostImportError, OutOfRange, VkrtError, VulkanError
from ..owned import Owned
from ..units import fmt_bytes
from .buffer import Buffer, BufferRange
from .imported import ImportedBuffer
from .memory_types import MemoryKind

log = logging.getLogger("vkrt")

PAGE = mmap.PAGESIZE


def host_span(source, size: int | None = None) -> tuple[int, int, object]:
    """(address, size, keep-alive) of a buffer-protocol object (array, mmap, bytearray, AnonymousMemory)
    or of an integer address with `size`."""
    if isinstance(source, int):
        if size is None:
            raise OutOfRange("registering a raw address needs its size")
        return source, size, None
    if getattr(source, "closed", False):
        raise HostImportError(f"cannot register {source!r}: it is closed")
    array = getattr(source, "array", source)  # AnonymousMemory / AnonymousRegion
    view = np.frombuffer(array, dtype=np.uint8) if not isinstance(array, np.ndarray) else array
    if not view.flags.c_contiguous:
        raise HostImportError("host memory to register must be contiguous")
    view = view.reshape(-1).view(np.uint8)
    nbytes = view.size if size is None else size
    if nbytes > view.size:
        raise OutOfRange(f"registering {nbytes} bytes of a {view.size}-byte object")
    return view.ctypes.data, nbytes, view


@dataclass(frozen=True)
class HostChunk:
    """Host bytes [start, end) readable by the GPU in `buffer`, whose offset 0 is host address `base`."""

    start: int
    end: int
    base: int
    buffer: Buffer
    imported: bool

    def range(self, address: int, size: int) -> BufferRange:
        return BufferRange(self.buffer, address - self.base, size)


@dataclass
class ImportStats:
    """Where registered bytes went. imported + copied + uncovered == registered."""

    regions: int = 0
    bytes_registered: int = 0
    bytes_imported: int = 0
    bytes_copied: int = 0      # host-visible fallback copies
    bytes_uncovered: int = 0   # neither imported nor copied: uploads stage them
    chunks: int = 0
    imported_chunks: int = 0
    copied_chunks: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, other: "ImportStats") -> None:
        for name in ("regions", "bytes_registered", "bytes_imported", "bytes_copied", "bytes_uncovered", "chunks",
                     "imported_chunks", "copied_chunks"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.failures.extend(other.failures)

    def summary(self) -> str:
        parts = [f"{fmt_bytes(self.bytes_imported)} imported in {self.imported_chunks} chunk(s)",
                 f"{fmt_bytes(self.bytes_copied)} copied to host-visible buffers in {self.copied_chunks} chunk(s)"]
        if self.bytes_uncovered:
            parts.append(f"{fmt_bytes(self.bytes_uncovered)} not registered (uploads stage it)")
        text = ", ".join(parts)
        if self.failures:
            text += "; " + "; ".join(self.failures)
        return text


class HostRegion(Owned):
    """One registered host range and the chunks that cover it. close() (or the registry's
    unregister) waits for GPU work, then releases every chunk; the host memory may go after."""

    def __init__(self, registry: "HostRegistry", address: int, size: int, keep, label: str):
        super().__init__(label)
        self.registry = registry
        self.device = registry.device
        self.address = address
        self.size = size
        self.chunks: list[HostChunk] = []
        self.stats = ImportStats(regions=1, bytes_registered=size)
        self.skipped = ""  # why nothing was imported or copied, when registration was off
        self._keep = keep  # the host object, so its memory cannot be freed while imported
        self.device.adopt(self)

    @property
    def end(self) -> int:
        return self.address + self.size

    def lookup(self, address: int, size: int) -> BufferRange | None:
        """The GPU range holding host bytes [address, address + size), or None (straddles chunks,
        or not covered)."""
        if self.closed:
            raise HostImportError(f"{self.label!r} was unregistered; its host memory is no longer GPU-visible")
        if not self.chunks or address < self.address:
            return None
        i = (address - self.chunks[0].base) // self.registry.chunk_size  # chunks are equal but the last
        if i >= len(self.chunks) or address + size > self.chunks[i].end:
            return None
        return self.chunks[i].range(address, size)

    def _release(self) -> None:
        self.device.forget(self)
        self.registry._forget(self)
        if self.chunks and not self.device.closed:
            self.device.compute.wait()
            self.device.transfer.wait()
        for chunk in self.chunks:
            chunk.buffer.close()
        self._keep = None


class HostRegistry(Owned):
    """Registered host ranges of one device, looked up by host address (bisect over chunk starts).

    `chunk_size` caps the chunk size (default: the device's settings.import_chunk, else the
    device limits); `enabled=False` (default: settings.register_host) registers nothing.
    """

    def __init__(self, device, *, chunk_size: int | None = None, enabled: bool | None = None,
                 label: str = "host registry"):
        super().__init__(label)
        self.device = device
        p = device.profile
        self.enabled = device.settings.register_host if enabled is None else enabled
        self.alignment = max(p.host_import_alignment, PAGE) if p.host_import else PAGE
        if chunk_size is None:
            chunk_size = device.settings.import_chunk
        limit = min(p.max_buffer_size, p.max_allocation_size, chunk_size or p.max_buffer_size)
        self.chunk_size = limit // self.alignment * self.alignment
        if self.chunk_size <= 0:
            raise ConfigError(f"import chunk size {limit} is below the import alignment {self.alignment}")
        self.regions: list[HostRegion] = []
        # (chunk starts, chunks), sorted and replaced as a whole so look-ups need no lock
        self._index: tuple[list[int], list[HostChunk]] = ([], [])
        self._lock = threading.RLock()
        device.adopt(self)

    # -- registration --------------------------------------------------------------------------
    def register(self, source, size: int | None = None, *, label: str | None = None,
                 fail_imports_after: int | None = None) -> HostRegion:
        """Make `size` bytes of `source` (array, mmap, AnonymousMemory, bytearray, or an int address
        with `size`) GPU-readable. `fail_imports_after=k` treats the (k+1)-th import as refused by
        the driver (to exercise the fallback). Returns the HostRegion; logs one summary line."""
        if self.closed:
            raise HostImportError(f"{self.label} is closed")
        address, size, keep = host_span(source, size)
        label = label or getattr(source, "label", None) or f"host range at 0x{address:x}"
        if size <= 0:
            raise OutOfRange(f"registering {label!r}: size must be positive, got {size}")
        with self._lock:
            for other in self.regions:
                if address < other.end and other.address < address + size:
                    raise HostImportError(f"registering {label!r} [0x{address:x}, 0x{address + size:x}): overlaps "
                                          f"{other.label!r} [0x{other.address:x}, 0x{other.end:x})")
            region = HostRegion(self, address, size, keep, label)
            try:
                self._cover(region, fail_imports_after)
            except BaseException:
                region.close()
                raise
            self.regions.append(region)
            chunks = sorted(self._index[1] + region.chunks, key=lambda c: c.start)
            self._index = ([c.start for c in chunks], chunks)
        s = region.stats
        summary = f"nothing imported: {region.skipped}" if region.skipped else s.summary()
        log.log(logging.WARNING if s.failures else logging.INFO, "registered %s of host memory %r on %s: %s",
                fmt_bytes(size), label, self.device.profile.name, summary)
        return region

    def _cover(self, region: HostRegion, fail_imports_after: int | None) -> None:
        stats = region.stats
        p = self.device.profile
        if not self.enabled or not p.host_import:
            stats.bytes_uncovered = region.size
            region.skipped = ("registration is off (VKRT_REGISTER_HOST=0 / --no-pin)" if not self.enabled
                              else f"{p.name} lacks VK_EXT_external_memory_host")
            return
        importing = True
        align = self.alignment
        base = region.address // align * align
        end = -(-region.end // align) * align
        index = 0
        while base < end:
            length = min(self.chunk_size, end - base)
            start, stop = max(base, region.address), min(base + length, region.end)
            label = f"{region.label} chunk {index}"
            buffer = None
            if importing:
                try:
                    if fail_imports_after is not None and index >= fail_imports_after:
                        raise HostImportError(f"importing {label!r} failed: refused on request "
                                              f"(fail_imports_after={fail_imports_after})")
                    buffer = ImportedBuffer(self.device, base, length, label=label)
                except (VulkanError, HostImportError) as exc:
                    importing = False
                    stats.failures.append(f"import failed at chunk {index}, copying from there on: {exc}")
            if buffer is None:
                try:
                    buffer = Buffer(self.device, length, MemoryKind.HOST, label=f"{label} (copy)")
                except VkrtError as exc:
                    stats.failures.append(f"fallback copy failed at chunk {index}, the rest stays unregistered: "
                                          f"{exc}")
                    stats.bytes_uncovered += region.end - start
                    return
                buffer.write(np.frombuffer(ffi.buffer(ffi.cast("char *", start), stop - start), np.uint8),
                             start - base)
            chunk = HostChunk(start, stop, base, buffer, imported=isinstance(buffer, ImportedBuffer))
            region.chunks.append(chunk)
            stats.chunks += 1
            if chunk.imported:
                stats.imported_chunks += 1
                stats.bytes_imported += stop - start
            else:
                stats.copied_chunks += 1
                stats.bytes_copied += stop - start
            base += length
            index += 1

    def unregister(self, region: HostRegion | int) -> None:
        """Release a region (or the region starting at an address); waits for GPU work first."""
        if isinstance(region, int):
            match = [r for r in self.regions if r.address == region]
            if not match:
                raise HostImportError(f"no registered host range starts at 0x{region:x}")
            region = match[0]
        region.close()

    def _forget(self, region: HostRegion) -> None:
        with self._lock:
            if region in self.regions:
                self.regions.remove(region)
            gone = {id(c) for c in region.chunks}
            chunks = [c for c in self._index[1] if id(c) not in gone]
            self._index = ([c.start for c in chunks], chunks)

    # -- look-up ---------------------------------------------------------------------------------
    def chunk_at(self, address: int) -> HostChunk | None:
        starts, chunks = self._index
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0:
            chunk = chunks[i]
            if address < chunk.end:
                return chunk
        return None

    def lookup(self, address: int, size: int) -> BufferRange | None:
        """The GPU range holding host bytes [address, address + size) when one chunk covers them."""
        chunk = self.chunk_at(address)
        if chunk is None or address + size > chunk.end:
            return None
        return chunk.range(address, size)

    def spans(self, address: int, size: int) -> list[BufferRange] | None:
        """GPU ranges covering [address, address + size) in order (several where it straddles
        chunks), or None when any byte is not registered."""
        out = []
        end = address + size
        while address < end:
            chunk = self.chunk_at(address)
            if chunk is None:
                return None
            n = min(end, chunk.end) - address
            out.append(chunk.range(address, n))
            address += n
        return out

    def stats(self) -> ImportStats:
        """Totals over the registered regions."""
        total = ImportStats()
        for region in list(self.regions):
            total.add(region.stats)
        return total

    def _release(self) -> None:
        self.device.forget(self)
        for region in list(self.regions):
            region.close()


def host_registry(device) -> HostRegistry:
    """The device's host registry (created on first use, closed with the device)."""
    return device.service("host-registry", HostRegistry)
