"""Host experts: the host's side of a decode step of host-resident MoE layers when it plans the
experts itself (docs/host-experts.md, `--cpu-experts auto|all`).

Per such layer and step the GPU routes the tokens and hands the routing to the host (the step's
command sequence is cut there). The host decides, per chosen expert: in the layer's VRAM expert
cache -> the GPU computes it; otherwise the CPU computes it (vkrt/cpu, reading the expert where
it lies in RAM) or it is copied over the link into a VRAM slot (and admitted to the cache),
whichever the measured rates say finishes first ("auto"; "all": every uncached expert on the
CPU). The GPU then copies what was planned and runs its experts and the shared expert while
the CPU computes the rest; the CPU's weighted sum joins the block output before the next layer.
`link_gbps` paces the copies to a slower link's rate (the step does not go on before the
copies would have crossed it).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

import numba
import numpy as np

from ..cpu.dot_types import DOTS
from ..cpu.expert_ffn import ACTIVATIONS, ExpertFFN, ExpertStack
from ..memory import F32, I32, Buffer, MemoryKind, Tensor
from ..model.transformer import EXPERT_TENSORS, HostExchange, StagedExperts
from ..ops.moe_stage import plan_words
from ..ops.mul_mat_id import RouteTable
from ..owned import Owned
from .expert_plan import copy_share, hybrid_pays, plan_step, prompt_on_host

log = logging.getLogger("vkrt")


@dataclass
class ExpertTraffic:
    """Where the (token, expert) pairs of decode steps ran, and the expert bytes that crossed the
    link, counted since the engine started."""

    tokens: int = 0
    pairs_cached: int = 0
    pairs_copied: int = 0
    pairs_cpu: int = 0
    bus_bytes: int = 0


@dataclass(frozen=True)
class CpuExpertOptions:
    """How decode treats host-resident experts not in the expert cache: `mode` "auto" (the CPU
    or a copy, by the measured `rates`), "all" (the CPU) or "off" (a copy: the host plans it to
    pace it), with `threads` CPU threads; `link_gbps` paces the copies (None: unpaced)."""

    mode: str
    threads: int
    link_gbps: float | None = None
    rates: object = None

    @property
    def link_or_measured(self) -> float | None:
        """The link's rate decisions assume: the paced one, else the measured one."""
        return self.link_gbps or (self.rates.h2d_gbps if self.rates is not None else None)


def cpu_expert_options(device, model, mode: str, threads: int | None, link_gbps: float | None):
    """The CpuExpertOptions of `--cpu-experts mode`, or None where the GPU plans and computes
    every expert itself: a model without host-resident experts, "off", or "auto" where splitting a
    step's experts between the link (`link_gbps`, else the measured one) and the CPU would not end
    it sooner than copying them all, the host's own work counted (expert_plan.hybrid_pays) -- but
    with a paced link (`link_gbps` or the setting) the host plans the copies ("off": every
    uncached expert copied) to pace them. Threads default to the CPU's cores; "auto" reads the
    box's rates (engine/box_rates.py: measured once per machine)."""
    link_gbps = link_gbps or device.settings.link_bandwidth
    types = sorted({model.weights[n].type.name for n in model.placement.host_tensors if "_exps." in n})
    if not types:
        asked = [f for f, on in (("--cpu-moe-threads", threads), ("--link-bandwidth", link_gbps),
                                 ("--cpu-experts all", mode == "all")) if on]
        if asked:
            log.warning("%s: %s keeps no expert in host memory (see --n-cpu-moe); nothing to place or pace",
                        ", ".join(asked), os.path.basename(getattr(model, "path", "the model")))
        return None
    if mode == "off" and threads:
        log.warning("--cpu-moe-threads %d: with --cpu-experts off the CPU computes no expert", threads)
    if mode == "off" and not link_gbps:
        return None
    cores = len(os.sched_getaffinity(0))
    threads = min(threads or cores, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(threads)
    options = CpuExpertOptions(mode, threads, link_gbps, None)
    if mode != "off":   # the rates decide auto's split, and for both which prompt steps the host plans
        from .box_rates import box_rates   # measures the box on first use: only where it decides
        options = dataclasses.replace(options, rates=box_rates(device, types=tuple(types)))
    if mode == "auto":
        k, link, cpu = model.cfg.n_expert_used, options.link_or_measured, cpu_rate(options.rates, types[0], threads)
        if link and cpu and not hybrid_pays(k, max_expert_bytes(model), link, cpu):
            log.info("--cpu-experts auto: the link (%.1f GB/s) against the CPU expert kernels (%.1f GB/s at %d "
                     "threads): copying every expert is as fast; the GPU computes them", link, cpu, threads)
            return dataclasses.replace(options, mode="off") if link_gbps else None
    return options


def layer_expert_bytes(model, il: int) -> int:
    """Bytes of one expert (gate, up and down) of layer il."""
    return sum(model.weights[f"blk.{il}.{n}"].nb[1] * model.weights[f"blk.{il}.{n}"].ne[1] for n in EXPERT_TENSORS)


def max_expert_bytes(model) -> int:
    """Bytes of the largest host-resident expert."""
    return max(layer_expert_bytes(model, int(n.split(".")[1]))
               for n in model.placement.host_tensors if "_exps." in n)


def cpu_rate(rates, type_name: str, threads: int) -> float | None:
    """The measured CPU expert rate of `type_name` (None: not measured)."""
    return rates.cpu_rate(type_name, threads) if rates is not None and rates.cpu_gbps.get(type_name) else None


class LayerCache:
    """The host's record of one layer's VRAM expert cache: which expert each of `slots` slots
    holds; the least recently used is replaced."""

    def __init__(self, n_expert: int, slots: int):
        self.slot_of = np.full(n_expert, -1, np.int64)
        self.expert_in = np.full(slots, -1, np.int64)
        self.used = np.zeros(slots, np.int64)

    @property
    def slots(self) -> int:
        return self.expert_in.size


def host_expert_types_ok(model, layers) -> str | None:
    """Why the CPU cannot compute these layers' experts (None: it can)."""
    act = model.cfg.spec.ffn.activation
    if act not in ACTIVATIONS:
        return f"activation {act} is not one the CPU expert kernels take"
    for il in layers:
        for n in EXPERT_TENSORS:
            t = model.weights[f"blk.{il}.{n}"]
            if t.type.name not in DOTS:
                return f"blk.{il}.{n} is {t.type.name}, a type the CPU expert kernels do not take"
    return None


class HostExperts(Owned):
    """Hybrid decode of the host-resident MoE layers of a stage (see the module docstring), over
    `staging`'s slots (made with a zero slot). `mode` "auto" or "all"; `rates` a BoxRates
    (h2d_gbps, cpu_rate(type, threads)) or None (then "auto" copies as often as the CPU runs)."""

    def __init__(self, model, staging, device, *, mode: str, threads: int, link_gbps: float | None, rates,
                 max_tokens: int):
        super().__init__("host experts")
        cfg = model.cfg
        self.model, self.staging, self.mode, self.threads = model, staging, mode, threads
        self.link_gbps, self.rates = link_gbps, rates
        self.traffic = ExpertTraffic()
        self._views: dict[int, StagedExperts] = {}
        self._ffn: dict[int, ExpertFFN] = {}
        self._cache: dict[int, LayerCache] = {}
        self._pending: dict[int, tuple] = {}
        self._stamp = 0
        self._hot = {il: np.zeros(cfg.n_expert, np.int64) for il in staging.layers}
        self.T = T = max_tokens
        self.mv_max_n = device.tuning.mv_max_n
        k, E = cfg.n_expert_used, cfg.n_embd
        # the CPU's pairs of a step (expert, token, weight): one layer's are in use at a time
        self._cpu_pairs = (np.empty(k * T, np.int32), np.empty(k * T, np.int32), np.empty(k * T, np.float32))
        self._to_host = self._from_host = self._routes = None
        try:
            # one exchange serves every layer: the host is done with a layer's before the next one's
            # routing is submitted, and each command sequence starts after the last one's commands
            self._to_host = Buffer(device, 4 * (E * T + 2 * k * T), MemoryKind.READBACK, label="routing to host")
            self._from_host = Buffer(device, 4 * (2 * k * T + plan_words(cfg.n_expert) + E * T), MemoryKind.HOST,
                                     label="expert plans and CPU sums")
            exchange = self._exchange(E, k, T, cfg.n_expert)
            views = staging.tensors()
            # a prompt step over the slots counts its pairs per slot: a table as wide as the widest view
            self._routes = RouteTable(device, max(v.stacks[0].ne[2] for v in views.values()), T)
            for il in staging.layers:
                self._views[il] = dataclasses.replace(views[il], host=exchange, routes=self._routes)
                if mode != "off":
                    self._ffn[il] = self._cpu_ffn(il)
                self._cache[il] = LayerCache(cfg.n_expert, staging.cache_slots)
        except BaseException:
            self.close()
            raise
        w = model.weights
        self.expert_bytes = {il: layer_expert_bytes(model, il) for il in staging.layers}
        link = link_gbps or (rates.h2d_gbps if rates is not None else None)
        fits = staging.cache_slots >= cfg.n_expert
        self._share = {il: copy_share(mode, link, cpu_rate(rates, w[f"blk.{il}.{EXPERT_TENSORS[0]}"].type.name,
                                                           threads), fits) for il in staging.layers}

    def _exchange(self, E: int, k: int, T: int, n_expert: int) -> HostExchange:
        down = up = 0

        def on(buf, at, typ, ne, name):
            n = 4 * int(np.prod(ne))
            return Tensor.on(buf.range(at, n), typ, ne, name=name), at + n
        x, at = on(self._to_host, down, F32, (E, T), "FFN input to host")
        ids, at = on(self._to_host, at, I32, (k, T), "routing ids to host")
        weights, _ = on(self._to_host, at, F32, (k, T), "routing weights to host")
        remap, at = on(self._from_host, up, I32, (k, T), "expert slots from host")
        gpu_weights, at = on(self._from_host, at, F32, (k, T), "GPU routing weights from host")
        plan, at = on(self._from_host, at, I32, (plan_words(n_expert),), "expert copies from host")
        cpu_sum, _ = on(self._from_host, at, F32, (E, T), "CPU expert sum")
        return HostExchange(x, ids, weights, remap, gpu_weights, plan, cpu_sum)

    def _cpu_ffn(self, il: int) -> ExpertFFN:
        m, cfg = self.model, self.model.cfg
        stacks = []
        for n, role in zip(EXPERT_TENSORS, ("gate", "up", "down")):
            t = m.weights[f"blk.{il}.{n}"]
            bias_name = f"blk.{il}.ffn_{role}_exps.bias"
            bias = None
            if cfg.spec.moe.expert_bias and bias_name in m.gguf.tensors:
                bias = m.gguf.data(bias_name).view(np.float32).reshape(t.ne[2], t.ne[1])
            stacks.append(ExpertStack(t.name, m.gguf.data(t.name), t.type.name, t.ne[0], t.ne[1], t.ne[2],
                                      t.nb[1], t.nb[2], bias))
        return ExpertFFN(*stacks, cfg.spec.ffn.activation)

    def takes_prompt(self, n_tokens: int, streams: bool) -> bool:
        """Whether a step of `n_tokens` runs the host-resident layers through the host's plan (the
        chosen experts copied, or computed on the CPU) rather than streaming every expert of a
        layer (`streams`: expert prefetch can) or reading them in place: up to mv_max_n tokens
        always; beyond, where the measured rates say it ends sooner (prompt_on_host)."""
        if n_tokens <= self.mv_max_n:
            return True
        if n_tokens > self.T or self.mode == "off":
            return False
        cfg, il = self.model.cfg, self.staging.layers[0]
        link = self.link_gbps or (self.rates.h2d_gbps if self.rates is not None else None)
        cpu = cpu_rate(self.rates, self.model.weights[f"blk.{il}.{EXPERT_TENSORS[0]}"].type.name, self.threads)
        if not link or not cpu:
            return False
        return prompt_on_host(n_tokens, cfg.n_expert, cfg.n_expert_used, max(self.expert_bytes.values()),
                              self._views[il].max_copies, link, cpu, streams, every_cpu=self.mode == "all")

    def tensors(self) -> dict[int, StagedExperts]:
        """layer -> where its decode steps stage experts, the host planning them."""
        return dict(self._views)

    # -- the host's work within a step ------------------------------------------------------------
    def before(self, host: tuple[str, int], n_tokens: int, previous) -> None:
        """The host's work before the segment `host` names (Part.host): ("plan", il) after
        `previous` (the routing of layer il) finished; ("cpu", il) while the GPU runs the rest
        of the layer."""
        what, il = host
        if what == "plan":
            previous.wait()
            self._plan(il, n_tokens)
        else:
            self._compute(il, n_tokens)

    def _plan(self, il: int, T: int) -> None:
        h, cache, view = self._views[il].host, self._cache[il], self._views[il]
        k = h.ids.ne[0]
        n = k * T
        self._stamp += 1
        cpu_e, cpu_t, cpu_w = self._cpu_pairs
        n_cpu, copied, copied_pairs, on_gpu = plan_step(
            _host(h.ids, np.int32)[:n], _host(h.weights, np.float32)[:n], k, cache.slot_of, cache.expert_in,
            cache.used, self._hot[il], self._stamp, self._share[il], view.max_copies, view.stage_base,
            self.staging.zero_slot - self.staging.view_base[il], _host(h.remap, np.int32)[:n],
            _host(h.gpu_weights, np.float32)[:n], _host(h.plan, np.int32), cpu_e, cpu_t, cpu_w)
        t = self.traffic
        if il == self.staging.layers[0]:
            t.tokens += T
        t.pairs_cpu += n_cpu
        t.pairs_copied += copied_pairs
        t.pairs_cached += on_gpu - copied_pairs
        t.bus_bytes += copied * self.expert_bytes[il]
        self._pending[il] = (cpu_e[:n_cpu], cpu_t[:n_cpu], cpu_w[:n_cpu], copied * self.expert_bytes[il],
                             time.perf_counter())

    def _compute(self, il: int, T: int) -> None:
        h = self._views[il].host
        E = h.x.ne[0]
        experts, tokens, weights, copy_bytes, t0 = self._pending.pop(il)
        out = _host(h.cpu_sum, np.float32)[:E * T].reshape(T, E)
        out[:] = 0
        if experts.size:
            x = _host(h.x, np.float32)[:E * T].reshape(T, E)
            self._ffn[il].run(x, experts, tokens, weights, out)
        if self.link_gbps and copy_bytes:
            wait = t0 + copy_bytes / (self.link_gbps * 1e9) - time.perf_counter()
            if wait > 0:
                time.sleep(wait)

    def _release(self) -> None:
        self._views.clear()
        self._ffn.clear()
        for b in (self._routes, self._to_host, self._from_host):
            if b is not None:
                b.close()


def _host(t: Tensor, dtype) -> np.ndarray:
    """The host-visible bytes of `t` as a flat array of `dtype`."""
    return t.buffer.host_bytes[t.offset:t.offset + t.nbytes].view(dtype)
