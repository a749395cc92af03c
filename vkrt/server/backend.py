"""What the server runs on: the device, the model and its engine, opened and closed together on
the scheduler thread, and the start-up report of what was placed where."""

from __future__ import annotations

import logging
import os
import resource
import time
from dataclasses import dataclass
from typing import Callable

from ..device.group import DeviceGroup, parse_device_list
from ..engine.box_rates import model_box_rates
from ..engine.logit_adjust import logit_adjustments
from ..engine.sampler import SamplingParams
from ..engine.step_inputs import PAD_STEP
from ..units import fmt_bytes

log = logging.getLogger("vkrt.server")


@dataclass
class Backend:
    device: object   # what the backend closes: the DeviceGroup (or a Device)
    model: object
    engine: object
    load_seconds: float = 0.0
    drafting: object = None   # speculative decoding (engine/drafting.py): closed first

    def close(self) -> None:
        for obj in (self.drafting, self.engine, self.model, self.device):
            if obj is not None:
                obj.close()

    def warm_up(self, n_parallel: int = 1) -> float:
        """Run a short prompt; where prompt steps are padded, steps of the padded sizes up to 512
        tokens as the scheduler makes them (a prompt chunk with each bucket of output rows up to
        the slots: other slots' decode tokens); record (not run) prompt steps of 16, 64, 256 and
        1024 tokens and of the micro-batch, so that every GEMM variant a prompt step takes (tile,
        split-K, experts staged or prefetched) exists before the first request (the NVIDIA
        compiler takes half a minute over some); and a decode step of every batch size the slots
        can make (with the GPU's candidates, with candidates of adjusted rows and with whole
        rows); then forget them, so requests do not pay for creating pipelines and recording
        graphs. Returns the seconds it took."""
        t0 = time.perf_counter()
        e = self.engine
        token = self.model.tokenizer.bos_id or 0
        e.eval([token] * min(8, e.n_ubatch), seq_id=0)
        longest = min(e.n_ubatch, e.n_ctx)
        padded = range(PAD_STEP, min(longest, 512) + 1, PAD_STEP) if e.pads_prompts else range(0)
        if padded:   # a prompt chunk with 0, 1, 3, 7, ... decode tokens: each size of output rows
            parts = sorted({e.out_rows(p, e.candidate_rows) for p in range(1, min(n_parallel, e.candidate_rows) + 1)})
            for n in padded:
                for rows in (p for p in parts if p < n):
                    e.reset()
                    e.mixed([(s, [token]) for s in range(1, rows)] + [(0, [token] * (n - rows + 1))], top=True)
        for n in sorted({min(n, longest) for n in (16, 64, 256, 1024, longest)}):
            if e.padded_tokens(n) not in padded:
                e.record_prompt_step(n)
        e.reset()
        bias = logit_adjustments(SamplingParams(logit_bias=((token, 0.0),)), [])   # the adjusted variant
        for n in range(1, min(n_parallel, e.n_ubatch) + 1):
            pairs = [(s, token) for s in range(n)]
            e.decode(pairs)
            if n <= e.candidate_rows:
                e.decode_candidates(pairs)
                e.decode_candidates(pairs, [bias] * n)
        e.reset()
        return time.perf_counter() - t0

    def report(self, n_parallel: int) -> list[str]:
        """Start-up lines: device(s), model, placement, pinning, memory, slots."""
        m, e = self.model, self.engine
        pl = m.placement
        if not pl.host_bytes:
            pinning = "nothing host-resident (all weights in VRAM)"
        elif pl.host_imported:
            pinning = (f"{fmt_bytes(pl.host_imported)} imported (pinned) host memory, "
                       f"{fmt_bytes(pl.host_copied)} copied to host-visible buffers")
        else:
            why = "disabled (--no-pin / VKRT_REGISTER_HOST=0)" if not m.device.settings.register_host \
                else "import refused"
            pinning = f"{why}: {fmt_bytes(pl.host_copied)} copied to host-visible buffers"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        lines = []
        for st in e.stages:
            dev = st.device
            p = dev.profile
            layers = f"; layers {st.layers.start}-{st.layers.stop - 1}" if e.split and len(st.layers) else ""
            lines.append(f"device: {dev.label if e.split else p.name} ({p.device_type}, "
                         f"{p.driver_info or p.driver_name}, arch {p.architecture.value}, VRAM {fmt_bytes(p.vram)}"
                         f"{layers})")
        heaps = "; ".join(
            (f"{st.device.label} " if e.split else "")
            + (", ".join(f"heap {i} {fmt_bytes(used)} of {fmt_bytes(h.size)}"
                         for i, (used, h) in enumerate(zip(st.device.heap_used, st.device.profile.heaps)) if used)
               or "none") for st in e.stages)
        cache_type = e.cache.type_name
        return lines + [
            f"model: {os.path.basename(m.path)} ({m.cfg.arch}, {fmt_bytes(m.size_bytes)}, "
            f"{m.n_params / 1e6:.1f} M parameters) loaded in {self.load_seconds:.1f} s "
            f"({'mmap' if m.gguf.mmap else 'no mmap'})",
            f"placement: {pl.summary()}",
            f"pinning: {pinning}",
            f"memory: device {heaps}; KV cache {fmt_bytes(e.kv_bytes)} ({e.n_ctx} cells, {cache_type}"
            + (f"; recurrent state: {e.state.describe()}" if e.recurrent else "")
            + f"); host peak RSS {fmt_bytes(rss)}",
            f"slots: {n_parallel} x {e.n_ctx // n_parallel} tokens; batch {e.n_batch}, micro-batch {e.n_ubatch}, "
            f"flash attention {'on' if e.flash_attn else 'off'}",
        ] + ([self.drafting.describe()] if self.drafting is not None else [])


def load_backend(load: Callable[[object], tuple[object, object]], devices: str | None = None,
                 settings=None, drafting: Callable | None = None) -> Backend:
    """Open the devices (`--device` LIST; None: the one vkrt picks) with `settings` (None: the
    environment's) and call load(devices) -> (model, engine); drafting(model, engine, devices)
    -> the Drafting of speculative decoding (None: off)."""
    t0 = time.perf_counter()
    group = DeviceGroup(parse_device_list(devices), settings=settings)
    try:
        model, engine = load(group)
    except BaseException:
        group.close()
        raise
    backend = Backend(group, model, engine)
    try:
        backend.drafting = drafting(model, engine, group) if drafting is not None else None
        model_box_rates(model)   # /props shows the box's rates where experts live in host memory (cached)
    except BaseException:
        backend.close()
        raise
    backend.load_seconds = time.perf_counter() - t0
    return backend
