"""`vkrt bench-h2d`: host -> device copy bandwidth through each of vkrt's host memory paths.

Paths: pageable memory through the staging ring; imported anonymous memory (the GPU copies
straight from it); a file-backed mmap (imported where the driver allows, else its host-visible
copy); the host-visible fallback copy (forced); and a naive upload that allocates a host-visible
buffer, copies into it and frees it every time (the peer of the staging ring). Each on the
compute and on the transfer queue. `python bench/h2d.py` runs the same measurement and, on an
NVIDIA GPU, CUDA pinned and pageable copies of the same sizes in the same run as the link's limit
(bench/cuda_h2d.py: the `reference` of run_benchmark). GB/s are 1e9 bytes per second,
from the median wall time of a complete upload (submit to completion). The bench registers host
memory whatever VKRT_REGISTER_HOST says: it measures the paths, not the setting.
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import tempfile
import time

import click

from .common import count, settings

NO_REFERENCE = "vkrt bench-h2d measures vkrt's paths only; python bench/h2d.py adds CUDA's copies"
SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
PATHS = ("staging", "imported", "mmap", "fallback", "naive")
PATH_NAMES = {
    "staging": "pageable via staging ring",
    "imported": "imported anonymous memory",
    "mmap": "file-backed mmap",
    "fallback": "host-visible fallback copy",
    "naive": "naive alloc+copy+free",
}


def _median_seconds(fn, iters: int) -> float:
    fn()  # warm-up: first-touch page faults, command buffers, pipelines
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _iters(size: int, iters: int | None) -> int:
    return iters or max(3, min(30, (256 << 20) // size))


def _registration(region) -> dict:
    s = region.stats
    if s.bytes_uncovered == s.bytes_registered:
        path = "unregistered"  # staged like pageable memory
    elif s.bytes_imported == s.bytes_registered:
        path = "import"
    else:
        path = "fallback" if not s.bytes_imported else "mixed"
    return {"path": path, "bytes_imported": s.bytes_imported, "bytes_copied": s.bytes_copied,
            "bytes_uncovered": s.bytes_uncovered, "chunks": s.chunks, "failures": list(s.failures)}


def _mapped_file(stack, path: str, data) -> tuple[int, object]:
    """Write `data` to `path` and map it read-only; (address, uint8 view without a buffer export,
    so the mapping can close while the view is still referenced)."""
    import numpy as np

    from vkrt.device.vk import ffi

    with open(path, "wb") as f:
        f.write(memoryview(data))
    file = stack.enter_context(open(path, "rb"))
    mapped = stack.enter_context(mmap.mmap(file.fileno(), data.size, access=mmap.ACCESS_READ))
    address = np.frombuffer(mapped, dtype=np.uint8).ctypes.data
    return address, np.frombuffer(ffi.buffer(ffi.cast("char *", address), data.size), dtype=np.uint8)


def _vkrt_rows(device, sizes, queues, iters, tmpdir) -> tuple[list[dict], dict]:
    import contextlib

    import numpy as np

    from vkrt.commands import CommandSequence, Uploader, download
    from vkrt.errors import VkrtError
    from vkrt.memory import Buffer, HostRegistry, MemoryKind
    from vkrt.memory.anonymous import AnonymousMemory

    top = sizes[-1]
    rows, registrations = [], {}
    pattern = (np.arange(-(-top // 4), dtype=np.uint32) * 2654435761).view(np.uint8)[:top]
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="vkrt-h2d-", dir=tmpdir))
        file_address, file_view = _mapped_file(stack, os.path.join(folder, "h2d.bin"), pattern)
        dst = stack.enter_context(Buffer(device, top, MemoryKind.DEVICE, label="h2d destination"))
        anon = stack.enter_context(AnonymousMemory(top, "h2d anonymous"))
        fb = stack.enter_context(AnonymousMemory(top, "h2d fallback"))
        registry = stack.enter_context(HostRegistry(device, enabled=True, label="h2d registry"))  # closed first
        clear = stack.enter_context(CommandSequence(device, label="h2d clear"))
        anon.array[:] = pattern
        fb.array[:] = pattern
        pageable = pattern.copy()
        t0 = time.perf_counter()
        registrations["anonymous"] = _registration(registry.register(anon, label="anonymous"))
        registrations["anonymous_register_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        registrations["fallback"] = _registration(registry.register(fb, label="forced fallback",
                                                                    fail_imports_after=0))
        registrations["fallback_register_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        registrations["mmap"] = _registration(registry.register(file_address, top, label="file-backed mmap"))
        registrations["mmap_register_seconds"] = time.perf_counter() - t0
        sources = {"staging": pageable, "imported": anon.array, "mmap": file_view, "fallback": fb.array}
        for queue in queues:
            with Uploader(device, queue, registry=registry, label=f"h2d {queue}") as up:
                family = up.queue.family
                for size in sizes:
                    target = dst.range(0, size)
                    with clear.record():
                        clear.fill(target, 0)
                    for name, src in sources.items():
                        clear.run()  # so that the check below sees this path's bytes
                        sec = _median_seconds(lambda: up.upload(target, src[:size]).wait(), _iters(size, iters))
                        rows.append(_row(name, queue, family, size, sec))
                        if not np.array_equal(download(device, target), pattern[:size]):
                            raise VkrtError(f"bench-h2d: {name} upload of {size} bytes on {queue} corrupted data")

                    def naive():
                        with Buffer(device, size, MemoryKind.HOST, label="naive staging") as tmp:
                            tmp.write(pageable[:size])
                            up.copy(tmp.range(), target).wait()
                    rows.append(_row("naive", queue, family, size, _median_seconds(naive, _iters(size, iters))))
    return rows, registrations


def _row(path: str, queue: str, family: int, size: int, seconds: float) -> dict:
    return {"path": path, "queue": queue, "queue_family": family, "size_bytes": size, "seconds": seconds,
            "gbps": size / seconds / 1e9}


def _annotate(rows: list[dict], cuda: dict | None) -> None:
    naive = {(r["queue"], r["size_bytes"]): r["gbps"] for r in rows if r["path"] == "naive"}
    pinned = {r["size_bytes"]: r["gbps"] for r in cuda["pinned"]} if cuda else {}
    pageable = {r["size_bytes"]: r["gbps"] for r in cuda["pageable"]} if cuda else {}
    for r in rows:
        if r["path"] == "staging":
            r["speedup_vs_naive"] = r["gbps"] / naive[(r["queue"], r["size_bytes"])]
            if r["size_bytes"] in pageable:
                r["fraction_of_cuda_pageable"] = r["gbps"] / pageable[r["size_bytes"]]
        if r["path"] != "naive" and r["size_bytes"] in pinned:
            r["fraction_of_cuda_pinned"] = r["gbps"] / pinned[r["size_bytes"]]


def run_benchmark(max_size: int, min_size: int, queues: list[str], iters: int | None, tmpdir: str | None,
                  reference=None, why_not: str = NO_REFERENCE) -> dict:
    """Measure every path at sizes min_size..max_size (powers of 4 from 1 MiB); one dict for --json.
    `reference(sizes, seconds) -> (result or None, why not)` measures CUDA's copies of the same
    sizes (bench/cuda_h2d.measure); None: not measured, for the reason `why_not`."""
    from vkrt.device import Device

    with Device(settings=settings()) as device:
        p = device.profile
        limit = min(p.max_buffer_size, p.max_allocation_size)
        sizes = [s for s in SIZES if min_size <= s <= min(max_size, limit)]
        if not sizes:
            raise click.UsageError(f"no size between {min_size} and {min(max_size, limit)} bytes; sizes are "
                                   "1 MiB, 4 MiB, ... 1 GiB")
        rows, registrations = _vkrt_rows(device, sizes, queues, iters, tmpdir)
        result = {**p.identity(),
                  "dedicated_transfer_queue": device.has_transfer_queue,
                  "compute_queue_family": device.compute.family, "transfer_queue_family": device.transfer.family,
                  "staging_segment_bytes": device.tuning.staging_segment,
                  "staging_segments": device.tuning.staging_segments,
                  "sizes_bytes": sizes, "gb_is_bytes": int(1e9), "registrations": registrations}
    cuda_result, why = None, why_not
    if reference is not None:
        cuda_result, why = reference(sizes, lambda copy, size: _median_seconds(copy, _iters(size, iters)))
    _annotate(rows, cuda_result)
    result["results"] = rows
    result["cuda"] = cuda_result
    result["cuda_not_measured"] = why if cuda_result is None else None
    result["summary"] = _summary(rows, cuda_result, sizes[-1])
    return result


def _summary(rows, cuda, top) -> dict:
    at_top = {(r["path"], r["queue"]): r for r in rows if r["size_bytes"] == top}
    out = {"size_bytes": top}
    for (path, queue), r in at_top.items():
        out[f"{path}_{queue}_gbps"] = r["gbps"]
        if "speedup_vs_naive" in r:
            out[f"staging_{queue}_speedup_vs_naive"] = r["speedup_vs_naive"]
        if path == "imported" and "fraction_of_cuda_pinned" in r:
            out[f"imported_{queue}_fraction_of_cuda_pinned"] = r["fraction_of_cuda_pinned"]
        if "fraction_of_cuda_pageable" in r:
            out[f"staging_{queue}_fraction_of_cuda_pageable"] = r["fraction_of_cuda_pageable"]
    if cuda:
        out["cuda_pinned_gbps"] = cuda["pinned"][-1]["gbps"]
        out["cuda_pageable_gbps"] = cuda["pageable"][-1]["gbps"]
    return out


def _size_label(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


def print_table(r: dict) -> None:
    sizes = r["sizes_bytes"]
    transfer = "dedicated transfer queue" if r["dedicated_transfer_queue"] else "no transfer queue: both are one queue"
    click.echo(f"host -> device on {r['device']} ({r['architecture']}; {transfer}); GB/s, 1 GB = 1e9 bytes")
    head = f"| {'path':<30} | {'queue':<8} |" + "".join(f" {_size_label(s):>8} |" for s in sizes)
    click.echo(head)
    click.echo("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    by_key: dict = {}
    for row in r["results"]:
        by_key.setdefault((row["path"], row["queue"]), {})[row["size_bytes"]] = row["gbps"]
    for path in PATHS:
        for queue in ("compute", "transfer"):
            if (path, queue) in by_key:
                cells = "".join(f" {by_key[(path, queue)].get(s, float('nan')):>8.2f} |" for s in sizes)
                click.echo(f"| {PATH_NAMES[path]:<30} | {queue:<8} |{cells}")
    cuda = r["cuda"]
    if cuda:
        for name in ("pinned", "pageable"):
            cells = "".join(f" {x['gbps']:>8.2f} |" for x in cuda[name])
            click.echo(f"| {'CUDA ' + name + ' (' + cuda['via'] + ')':<30} | {'cuda':<8} |{cells}")
    for name in ("anonymous", "mmap"):
        reg = r["registrations"][name]
        how = {"import": "imported", "unregistered": "not registered (staged)"}.get(reg["path"], reg["path"])
        if reg["failures"]:
            how += f" ({'; '.join(reg['failures'])})"
        click.echo(f"{'file-backed mmap' if name == 'mmap' else 'anonymous memory'} registration: {how}")
    click.echo(f"fallback registration copied {_size_label(r['sizes_bytes'][-1])} in "
               f"{r['registrations']['fallback_register_seconds'] * 1e3:.0f} ms")
    s = r["summary"]
    for queue in ("compute", "transfer"):
        if f"staging_{queue}_speedup_vs_naive" in s:
            line = f"{queue}: staging is {s[f'staging_{queue}_speedup_vs_naive']:.2f}x naive"
            if f"imported_{queue}_fraction_of_cuda_pinned" in s:
                line += f"; imported is {s[f'imported_{queue}_fraction_of_cuda_pinned'] * 100:.0f}% of CUDA pinned"
            click.echo(line + f" (at {_size_label(s['size_bytes'])})")
    if not cuda:
        click.echo(f"CUDA pinned/pageable: not measured ({r['cuda_not_measured']})")


def h2d_options(f):
    """--max-size, --min-size, --queue, --iters, --tmpdir, --json (decorator; also bench/h2d.py's)."""
    opts = [
        click.option("--max-size", default=None, help="Largest size (e.g. 256M, 1G). Default 1G; 64M on a CPU device."),
        click.option("--min-size", default="1M", show_default=True, help="Smallest size."),
        click.option("--queue", "queue", type=click.Choice(["both", "compute", "transfer"]), default="both",
                     show_default=True, help="Queue(s) to upload on."),
        click.option("--iters", type=count(1), default=None, help="Timed repetitions per size (default: 3-30 by size)."),
        click.option("--tmpdir", default=None, help="Where the file for the file-backed mmap goes (default: $TMPDIR)."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.command("bench-h2d")
@h2d_options
def bench_h2d(max_size, min_size, queue, iters, tmpdir, as_json) -> None:
    """Host -> device bandwidth of each host memory path (GB/s), 1 MiB to 1 GiB (with CUDA's
    pinned and pageable copies as the reference: python bench/h2d.py)."""
    measure_and_report(max_size, min_size, queue, iters, tmpdir, as_json)


def measure_and_report(max_size, min_size, queue, iters, tmpdir, as_json, reference=None,
                       why_not: str = NO_REFERENCE) -> None:
    """bench-h2d's options -> run_benchmark -> the table or one JSON line."""
    from vkrt.device.instance import Instance
    from vkrt.device.selection import select_device
    from vkrt.units import parse_size

    if max_size is None:
        with Instance(validate=False, settings=settings()) as instance:
            cpu = select_device(instance.profiles(), instance.settings.device).device_type == "cpu"
        max_bytes = (64 << 20) if cpu else (1 << 30)
    else:
        max_bytes = parse_size(max_size, "--max-size")
    queues = ["compute", "transfer"] if queue == "both" else [queue]
    result = run_benchmark(max_bytes, parse_size(min_size, "--min-size"), queues, iters, tmpdir, reference, why_not)
    if as_json:
        click.echo(json.dumps(result))
    else:
        print_table(result)
