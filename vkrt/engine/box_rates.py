"""What this box (CPU, RAM, GPU link) moves a second, measured once and cached: the host -> VRAM
copy rate of host-resident weights, the CPU's RAM read rate, and the expert weight bytes the CPU
expert FFN gets through per weight type and thread count. The engine weighs copying a host expert
to the GPU against computing it on the CPU with them (docs/host-experts.md).

    box_rates(device, ["Q4_K"])   # read from <cache dir>/box/<key>.json, measuring what is missing
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import itertools
import json
import logging
import math
import os
import platform
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numba
import numpy as np
from numba import njit, prange

from ..commands.copy_commands import CopyCommands
from ..cpu.dot_types import DOTS
from ..cpu.expert_ffn import ExpertFFN, ExpertStack
from ..errors import HostImportError, VkrtError, VulkanError
from ..memory.anonymous import PAGE, AnonymousMemory
from ..memory.buffer import Buffer
from ..memory.ggml_types import TYPES
from ..memory.imported import ImportedBuffer
from ..memory.memory_types import MemoryKind

log = logging.getLogger("vkrt")

CACHE_VERSION = 1
GROUP = 8            # experts one token routes to (Qwen3.5-35B-A3B): the experts one timed FFN call reads
PATTERN_ROWS = 16    # distinct synthetic weight rows, repeated over the expert stack
IMPORTED, HOST_VISIBLE = "imported host memory", "host-visible buffer"


@dataclass(frozen=True)
class Sizes:
    """How much each measurement moves and how long it repeats (tests pass tiny ones)."""

    h2d_bytes: int = 128 << 20
    ram_bytes: int = 256 << 20      # the array the RAM read sums, at least
    expert_bytes: int = 64 << 20    # expert weights one timed CPU run reads
    n_embd: int = 2048              # gate/up rows of n_embd values, down rows of n_ff (Qwen3.5-35B-A3B)
    n_ff: int = 512
    seconds: float = 0.25           # each rate is the best run of this much repeating (per thread count)
    past_cache: float = 2.0         # the RAM array and the expert stack span this many largest CPU caches


DEFAULT_SIZES = Sizes()


@dataclass(frozen=True)
class BoxRates:
    """One box's measured rates in GB/s (1e9 bytes a second); None where that part failed."""

    cpu: str                          # the CPU's model name
    cores: int                        # cores this process may run on
    device: str                       # the GPU's name
    measured: str                     # ISO date of the latest measurement
    h2d_gbps: float | None            # host memory -> VRAM copy
    h2d_path: str | None              # IMPORTED or HOST_VISIBLE: where the copy read from
    ram_gbps: float | None            # CPU reading RAM with every core
    cpu_gbps: dict[str, dict[int, float]] = field(default_factory=dict)  # type -> threads -> expert bytes read

    def cpu_rate(self, type_name: str, threads: int) -> float:
        """GB/s of `type_name` expert weights the CPU FFN reads with `threads` threads, linear
        between the measured thread counts (the nearest one outside them)."""
        rates = self.cpu_gbps.get(type_name)
        if not rates:
            raise VkrtError(f"no CPU expert rate for {type_name} on this box "
                            f"(measured: {', '.join(self.cpu_gbps) or 'none'}); measure it with box_rates(device, "
                            f"[{type_name!r}]) or `vkrt devices --types {type_name}`")
        if threads < 1:
            raise VkrtError(f"a CPU rate needs at least 1 thread, not {threads}")
        counts = sorted(rates)
        return float(np.interp(threads, counts, [rates[n] for n in counts]))

    def as_dict(self) -> dict:
        """The rates as JSON-ready data (thread counts as text keys)."""
        d = dataclasses.asdict(self)
        d["cpu_gbps"] = {t: {str(n): r for n, r in sorted(v.items())} for t, v in self.cpu_gbps.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> BoxRates:
        """as_dict()'s inverse; ValueError / TypeError / KeyError where `d` is not such data."""
        cpu = {str(t): {int(n): float(r) for n, r in v.items()} for t, v in d["cpu_gbps"].items()}
        if any(n < 1 or not r > 0 for v in cpu.values() for n, r in v.items()):
            raise ValueError("a CPU rate has a thread count below 1 or a rate that is not positive")
        return cls(cpu=str(d["cpu"]), cores=int(d["cores"]), device=str(d["device"]), measured=str(d["measured"]),
                   h2d_gbps=_rate(d["h2d_gbps"]), h2d_path=None if d["h2d_path"] is None else str(d["h2d_path"]),
                   ram_gbps=_rate(d["ram_gbps"]), cpu_gbps=cpu)

    def summary_lines(self) -> list[str]:
        """The rates as text, a line each."""
        h2d = f"{self.h2d_gbps:.1f} GB/s from {self.h2d_path}" if self.h2d_gbps else "not measured"
        ram = f"{self.ram_gbps:.1f} GB/s with {self.cores} threads" if self.ram_gbps else "not measured"
        lines = [f"box: {self.cpu}, {self.cores} cores, {self.device} (measured {self.measured})",
                 f"  host -> GPU copy   {h2d}", f"  RAM read           {ram}"]
        for type_name, rates in self.cpu_gbps.items():
            lines.append(f"  CPU experts {type_name:<7}" + ", ".join(
                f"{r:.1f} GB/s with {n} thread{'s' if n > 1 else ''}" for n, r in sorted(rates.items())))
        return lines


def _rate(value) -> float | None:
    if value is None:
        return None
    if not float(value) > 0:
        raise ValueError(f"a rate of {value!r} GB/s")
    return float(value)


def footer_line(rates: BoxRates) -> str:
    """One line for a benchmark's footer: the box and its rates at all cores."""
    parts = [f"h2d {rates.h2d_gbps:.1f} GB/s ({rates.h2d_path})" if rates.h2d_gbps else "h2d not measured",
             f"RAM {rates.ram_gbps:.1f} GB/s" if rates.ram_gbps else "RAM not measured"]
    parts += [f"CPU {t} {rates.cpu_rate(t, rates.cores):.1f} GB/s" for t in rates.cpu_gbps]
    return f"box: {rates.cpu}, {rates.cores} cores; " + ", ".join(parts)


# -- what the box is ------------------------------------------------------------------------------

def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (else what `platform` says)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip().lower() in ("model name", "hardware", "cpu model") and value.strip():
                return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def largest_cache() -> int:
    """Bytes of the CPU's largest cache (sysfs), 0 where unknown."""
    found = [0]
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            found.append(int(text.rstrip("KMG")) * unit)
    return max(found)


def _past_cache(floor: int, sizes: Sizes) -> int:
    return max(floor, int(sizes.past_cache * largest_cache()))


def thread_counts(cores: int) -> list[int]:
    """The thread counts the CPU rates are measured at: 1, half the cores, all (numba's pool caps them)."""
    top = min(cores, numba.config.NUMBA_NUM_THREADS)
    return sorted({1, max(1, top // 2), top})


def cache_path(device) -> Path:
    """<cache dir>/box/<key>.json, the key naming the GPU and hashing the CPU, core count and GPU
    (name, vendor and device ids, driver version, index: the profile has no UUID)."""
    p = device.profile
    ident = f"{cpu_name()}|{cpu_cores()}|{p.name}|{p.vendor_id:04x}:{p.device_id:04x}|{p.driver_version}|{p.index}"
    slug = re.sub(r"[^a-z0-9]+", "-", p.name.lower()).strip("-")[:40] or "device"
    return device.settings.cache_dir / "box" / f"{slug}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}.json"


def expert_types(tensors: Mapping, names: Iterable[str] | None = None) -> tuple[str, ...]:
    """The GGUF types of the expert matrices (ffn_*_exps.weight) among `tensors` (name -> an object
    with `.type`), or among `names` of them, in order of first appearance."""
    names = tensors if names is None else names
    return tuple(dict.fromkeys(tensors[n].type.name for n in names if n.endswith("_exps.weight")))


def host_expert_types(model) -> tuple[str, ...]:
    """The GGUF types of a loaded model's host-resident expert matrices (empty: all in VRAM)."""
    return expert_types(model.weights, model.placement.host_tensors)


# -- the measurements ----------------------------------------------------------------------------

@contextlib.contextmanager
def _threads(n: int):
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def _timed(run: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _best_seconds(run: Callable[[], None], seconds: float, least: int = 2) -> float:
    """The shortest of run()'s timings, repeated until `seconds` have passed (at least `least` times)."""
    best, start, n = math.inf, time.perf_counter(), 0
    while n < least or time.perf_counter() - start < seconds:
        best = min(best, _timed(run))
        n += 1
    return best


def measure_h2d(device, sizes: Sizes = DEFAULT_SIZES) -> tuple[float | None, str | None]:
    """(GB/s, path) of copying host memory into a DEVICE buffer on the transfer queue: from host
    memory imported as host-resident weights are, else from a host-visible buffer; (None, None)
    where it fails."""
    p = device.profile
    align = max(p.host_import_alignment, PAGE) if p.host_import else PAGE
    size = -(-sizes.h2d_bytes // align) * align
    try:
        with contextlib.ExitStack() as stack:
            host = stack.enter_context(AnonymousMemory(size + align, "box rates: copy source"))
            start = -(-host.address // align) * align - host.address
            view = host.array[start:start + size]
            view[:] = 1   # fault the pages in
            src, path = _copy_source(device, view, stack)
            dst = stack.enter_context(Buffer(device, size, MemoryKind.DEVICE, label="box rates: copy destination"))
            copies = stack.enter_context(CopyCommands(device, device.transfer, "box rates: copies"))
            pair = [(src.range(0, size), dst.range(0, size))]

            def run():
                device.transfer.wait(copies.submit(pair))
            run()
            return size / _best_seconds(run, sizes.seconds) / 1e9, path
    except VkrtError as exc:
        log.warning("box rates: measuring the host -> GPU copy on %s failed: %s", p.name, exc)
        return None, None


def _copy_source(device, view: np.ndarray, stack: contextlib.ExitStack) -> tuple[Buffer, str]:
    p = device.profile
    if p.host_import:
        try:
            return stack.enter_context(ImportedBuffer(device, view.ctypes.data, view.size,
                                                      label="box rates: imported copy source")), IMPORTED
        except (VulkanError, HostImportError) as exc:
            log.info("box rates: importing host memory failed (%s); timing a host-visible buffer instead", exc)
    else:
        log.info("box rates: %s lacks VK_EXT_external_memory_host; timing a host-visible buffer", p.name)
    buf = stack.enter_context(Buffer(device, view.size, MemoryKind.HOST, label="box rates: host-visible copy source"))
    buf.write(view)
    return buf, HOST_VISIBLE


@njit(parallel=True, nogil=True, cache=True)
def _sum(a):
    total = 0
    for i in prange(a.size):
        total += a[i]
    return total


def measure_ram(sizes: Sizes = DEFAULT_SIZES) -> float | None:
    """GB/s of the CPU summing an array of sizes.ram_bytes (or sizes.past_cache times the
    largest cache) with every core; None where it fails."""
    try:
        with AnonymousMemory(max(8, _past_cache(sizes.ram_bytes, sizes)) // 8 * 8, "box rates: RAM") as ram, \
                _threads(thread_counts(cpu_cores())[-1]):
            ram.array[:] = 1   # every page real (huge pages where the kernel gives them, as --no-mmap weights get)
            _sum(ram.array.view(np.int64))
            seconds = _best_seconds(lambda: _sum(ram.array.view(np.int64)), sizes.seconds)
            return ram.size / seconds / 1e9
    except Exception as exc:   # no memory, or numba failing to build the loop
        log.warning("box rates: timing the RAM read failed: %s: %s", type(exc).__name__, exc)
        return None


def synthetic_weights(type_name: str, k: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Flat bytes of `rows` rows of `k` values of `type_name` with finite, moderate scales:
    PATTERN_ROWS rows quantised from random values where gguf's numpy quantiser takes the type,
    else random bytes in 0x20..0x3b (any fp16 field of them lies between 2^-7 and 1), repeated."""
    try:
        values = rng.standard_normal((PATTERN_ROWS, k)).astype(np.float32)
        pattern = gguf.quants.quantize(values, gguf.GGMLQuantizationType[type_name])
    except NotImplementedError:
        pattern = rng.integers(0x20, 0x3C, (PATTERN_ROWS, TYPES[type_name].row_bytes(k)), dtype=np.uint8)
    return np.resize(pattern.reshape(-1), rows * pattern.shape[1])


def synthetic_ffn(type_name: str, sizes: Sizes, total_bytes: int) -> tuple[ExpertFFN, int]:
    """(FFN, experts): a silu ExpertFFN of `type_name` over enough n_embd x n_ff experts (a
    multiple of GROUP) to hold `total_bytes`."""
    t = TYPES[type_name]
    e, f = sizes.n_embd, sizes.n_ff
    gu_row, d_row = t.row_bytes(e), t.row_bytes(f)
    n_expert = max(1, -(-total_bytes // ((2 * f * gu_row + e * d_row) * GROUP))) * GROUP
    rng = np.random.default_rng(51)

    def stack(name: str, k: int, rows: int, row_bytes: int) -> ExpertStack:
        data = synthetic_weights(type_name, k, rows * n_expert, rng)
        return ExpertStack(name, data, type_name, k, rows, n_expert, row_bytes, rows * row_bytes)
    return ExpertFFN(stack("gate", e, f, gu_row), stack("up", e, f, gu_row), stack("down", f, e, d_row), "silu"), n_expert


def measure_cpu(type_name: str, sizes: Sizes = DEFAULT_SIZES) -> dict[int, float]:
    """{threads: GB/s of expert weights read} of the CPU expert FFN on `type_name` experts: one
    token through GROUP experts a call, a timed run of calls reading sizes.expert_bytes, the runs
    going round a stack of sizes.past_cache times the largest cache (so each reads from RAM)."""
    ffn, n_expert = synthetic_ffn(type_name, sizes, _past_cache(sizes.expert_bytes, sizes))
    x = np.random.default_rng(52).standard_normal((1, sizes.n_embd)).astype(np.float32)
    out = np.zeros_like(x)
    tokens, weights = np.zeros(GROUP, np.int32), np.full(GROUP, 1 / GROUP, np.float32)
    order = itertools.cycle([np.arange(i, i + GROUP, dtype=np.int32) for i in range(0, n_expert, GROUP)])
    calls = min(n_expert // GROUP, -(-sizes.expert_bytes // (GROUP * ffn.expert_bytes())))

    def run():
        for _ in range(calls):
            ffn.run(x, next(order), tokens, weights, out)
    counts = thread_counts(cpu_cores())
    best = dict.fromkeys(counts, math.inf)
    with _threads(counts[-1]):
        run()   # compiles the kernels, starts numba's threads
    # rounds over the thread counts, so that a passing slowdown of the box spoils none of them
    start, rounds = time.perf_counter(), 0
    while rounds < 2 or time.perf_counter() - start < sizes.seconds * len(counts):
        for n in counts:
            with _threads(n):
                best[n] = min(best[n], _timed(run))
        rounds += 1
    nbytes = calls * GROUP * ffn.expert_bytes()
    return {n: nbytes / t / 1e9 for n, t in best.items()}


# -- the cache -------------------------------------------------------------------------------------

def cached_box_rates(device) -> BoxRates | None:
    """The rates cached for this box, or None (nothing measured yet, or an unreadable file); never measures."""
    return _read(cache_path(device))


def _read(path: Path) -> BoxRates | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("box rates: cannot read the cache file %s (%s); measuring again", path, exc)
        return None
    try:
        data = json.loads(text)
        if data.get("version") != CACHE_VERSION:
            raise ValueError(f"version {data.get('version')!r}, not {CACHE_VERSION}")
        return BoxRates.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("box rates: the cache file %s is unreadable (%s); measuring again", path, exc)
        return None


def _write(path: Path, rates: BoxRates) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"version": CACHE_VERSION, **rates.as_dict()}, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("box rates: cannot write the cache file %s (%s); the next run measures again", path, exc)


def _cpu_types(types: Iterable[str]) -> list[str]:
    out = []
    for name in types:
        name = str(name).upper()
        if name in DOTS:
            out.append(name)
        else:
            log.warning("box rates: the CPU expert kernels do not take %s (they take %s); not measured",
                        name, ", ".join(DOTS))
    return list(dict.fromkeys(out))


def _measure_cpu_types(types: list[str], sizes: Sizes) -> dict[str, dict[int, float]]:
    out = {}
    for name in types:
        try:
            out[name] = measure_cpu(name, sizes)
        except Exception as exc:   # a kernel that does not compile or run costs its type, not the rest
            log.warning("box rates: measuring the CPU expert FFN on %s failed: %s: %s", name, type(exc).__name__, exc)
    return out


def box_rates(device, types: Iterable[str] = (), refresh: bool = False, sizes: Sizes | None = None,
              announce: Callable[[str], None] | None = None) -> BoxRates:
    """This box's rates with CPU rates for `types` (GGUF weight type names): read from the cache,
    the types it lacks measured and added; `refresh` measures everything again (the cached types
    too). `sizes` (default DEFAULT_SIZES) sets how much each measurement moves; `announce(text)`
    hears what is about to be measured (it takes seconds)."""
    sizes = sizes or DEFAULT_SIZES
    wanted = _cpu_types(types)
    path = cache_path(device)
    cached = _read(path)
    if cached is not None and not refresh and all(t in cached.cpu_gbps for t in wanted):
        return cached
    what = ("this box's rates" if refresh or cached is None
            else "the CPU expert rates of " + ", ".join(t for t in wanted if t not in cached.cpu_gbps))
    log.info("box rates: measuring %s (cached in %s)", what, path)
    if announce is not None:
        announce(f"measuring {what} (once; cached in {path})")
    if cached is None or refresh:
        h2d, h2d_path = measure_h2d(device, sizes)
        ram = measure_ram(sizes)
        cpu = _measure_cpu_types(list(dict.fromkeys([*(cached.cpu_gbps if cached else ()), *wanted])), sizes)
    else:
        h2d, h2d_path, ram = cached.h2d_gbps, cached.h2d_path, cached.ram_gbps
        cpu = {**cached.cpu_gbps, **_measure_cpu_types([t for t in wanted if t not in cached.cpu_gbps], sizes)}
    rates = BoxRates(cpu=cpu_name(), cores=cpu_cores(), device=device.profile.name,
                     measured=datetime.date.today().isoformat(), h2d_gbps=h2d, h2d_path=h2d_path, ram_gbps=ram,
                     cpu_gbps=cpu)
    _write(path, rates)
    for line in rates.summary_lines():
        log.info("%s", line)
    return rates


def model_box_rates(model, refresh: bool = False) -> BoxRates | None:
    """At a server's start: the box's rates for the types of `model`'s host-resident experts
    (measured where the cache lacks them), None where it keeps every expert in VRAM."""
    types = host_expert_types(model)
    return box_rates(model.device, types, refresh) if types else None
