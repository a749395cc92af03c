"""Stage: one device's part of an engine. An engine on one device has one stage holding every
layer; a layer split (`-sm layer`) has one per device, each running its layers' part of every
step (stage k hands the residual stream to stage k+1 through a Handoff)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..commands import CommandSequence
from ..errors import BufferTooLarge, ConfigError
from ..memory import Buffer, MemoryKind
from ..model.fuse import enabled
from ..model.transformer import Scratch, Transformer
from ..owned import Owned
from .kv_cache import KVCache
from .prefetch import ExpertPrefetch, slot_bytes, slots_requested
from .recurrent_state import RecurrentState, keep_columns
from .host_experts import CpuExpertOptions, HostExperts, host_expert_types_ok
from .staging import ExpertStaging, staged_layers

CACHE_RESERVE = 512 << 20   # VRAM the automatic expert cache leaves free

log = logging.getLogger("vkrt")



@dataclass
class StageGraph:
    """A stage's recorded part of one step shape: one sequence, or with expert prefetch one
    sequence per segment, segment k >= 1 starting at the MoE block of prefetched layer k - 1;
    or, with host-planned experts, `hosts[k]` the host's work before segment k ((what, layer),
    Part.host; None: none) for a step of `n_tokens`."""

    seqs: list[CommandSequence]
    prefetched: list[int]
    hosts: list = field(default_factory=list)
    n_tokens: int = 0

    def close(self) -> None:
        for seq in self.seqs:
            seq.close()


class Stage(Owned):
    """Layers `layers` of `model` on `device`: their KV cache (cells in the engine's shared
    `cells` table), recurrent state (None without DeltaNet layers), activations (`scratch`),
    the step-input buffer (two copies, `layout` names each input's offset), and, after
    add_experts(), expert staging and prefetch for its host-resident MoE layers. `output`: this
    stage runs the output matrix (the model's tied-embedding copy where it has one). embd_input:
    its steps may take input embeddings (an image's rows) instead of token ids. verify_tokens: as
    Engine's."""

    def __init__(self, model, device, layers: range, cells, *, n_ctx: int, n_ubatch: int, flash_attn: bool,
                 kv_type, n_seq_max: int, n_checkpoints: int, output: bool, kv_type_v=None, embd_input: bool = False,
                 verify_tokens: int = 0):
        super().__init__(f"stage on {device.label}")
        cfg = model.cfg
        self.model, self.device, self.layers = model, device, layers
        self.cache = self.state = self.scratch = self.inputs = self.prefetch = self.staging = None
        self.host_experts = None   # HostExperts: the host plans the decode steps' experts, the CPU computes some
        self.transformer = Transformer(cfg, model.weights, enabled(self.device.settings.fuse),
                                       self.device.settings.fa_mask_opt, output=model.output_weight if output else None,
                                       n_ctx_seq=n_ctx)   # one cell table for all sequences: llama.cpp's unified KV
        try:
            try:
                self.cache = KVCache(device, [il for il in cfg.kv_layers if il in layers], cfg.head_dim_k,
                                     cfg.head_dim_v, cfg.n_head_kv, n_ctx, kv_type, cells=cells,
                                     v_type=kv_type_v, rotate=device.settings.kv_rotation)
            except BufferTooLarge as exc:
                raise ConfigError(f"{exc}: the KV cache grows with the context; lower -c (now {n_ctx})") from None
            if any(il in layers for il in cfg.linear_layers):
                self.state = RecurrentState(device, cfg, max(1, n_seq_max), n_checkpoints, layers=layers,
                                            keep_columns=keep_columns(n_ubatch, verify_tokens))
            self.scratch = Scratch(device, cfg, n_ubatch, n_ctx, flash_attn, embd_input)
            self.layout, size = {}, 0
            for name, t in self.scratch.inputs().items():   # host copies of the step inputs, packed
                self.layout[name] = size
                size += -(-t.nbytes // 16) * 16
            self.inputs_size = size   # two copies: a step's inputs are written while the last one runs
            self.inputs = Buffer(device, 2 * size, MemoryKind.HOST, label="step inputs")
        except BaseException:
            self.close()
            raise

    def add_experts(self, n_ubatch: int, stage_experts: bool | None, expert_cache: int | None,
                    prefetch_slots: int | None, cpu: CpuExpertOptions | None = None, reserve: int = 0) -> None:
        """Expert staging (with the decode expert cache) and prefetch slots; after the engine's
        other buffers, as the automatic cache takes what VRAM is left (less `reserve` bytes: a
        vision encoder's buffers). `cpu`: the host plans the decode steps' experts and the CPU
        computes some (HostExperts), where it can."""
        cache = self._cache_bytes(expert_cache, prefetch_slots, reserve)
        hybrid = cpu is not None and self._hybrid(cpu)
        self.staging = ExpertStaging(self.model, n_ubatch, True if hybrid else stage_experts, cache,  # before
                                     device=self.device, layers=self.layers, zero_slot=hybrid)  # prefetch: it leaves room
        if hybrid and self.staging.layers:
            self.host_experts = HostExperts(self.model, self.staging, self.device, mode=cpu.mode, threads=cpu.threads,
                                            link_gbps=cpu.link_gbps, rates=cpu.rates, max_tokens=n_ubatch)
        self.prefetch = ExpertPrefetch(self.model, prefetch_slots, device=self.device, layers=self.layers)

    def _hybrid(self, cpu: CpuExpertOptions) -> bool:
        """Whether this stage's host-resident MoE layers run hybrid decode (logs why not)."""
        layers = staged_layers(self.model, self.layers)
        if not layers:
            return False
        why = host_expert_types_ok(self.model, layers) if cpu.mode != "off" else None
        if why is not None:
            log.warning("--cpu-experts %s: %s; the GPU computes every expert", cpu.mode, why)
            return False
        return True

    def _cache_bytes(self, requested: int | None, prefetch_slots: int | None, extra: int = 0) -> int:
        """VRAM for the decode expert cache: `requested` bytes, or (None) what is free after the
        prefetch slots and a reserve for the rest of the run, up to every host-resident expert."""
        if requested is not None:
            return max(0, requested)
        want = slots_requested(prefetch_slots, self.device.settings) * slot_bytes(self.model, self.layers)
        reserve = max(CACHE_RESERVE, self.device.vram_free // 20) + extra
        return max(0, self.device.vram_free - want - reserve)

    def record(self, parts, input_sizes: dict, parity: int, ids_on_gpu: bool, label: str,
               n_tokens: int = 0) -> StageGraph:
        """Record `parts` (Transformer.parts of this stage), cut before each prefetched MoE block
        and each part the host works before; the first sequence starts by copying the step
        inputs (copy `parity`) to the GPU."""
        segments: list[list] = [[]]
        hosts: list = [None]
        for part in parts:
            if part.layer is not None or part.host is not None:
                segments.append([])
                hosts.append(part.host)
            segments[-1].append(part)
        seqs = []
        try:
            for k, segment in enumerate(segments):
                seq = CommandSequence(self.device, label=f"{label} part {k}")
                seqs.append(seq)
                with seq.record():
                    if k == 0:
                        base = parity * self.inputs_size
                        for name, t in self.scratch.inputs().items():
                            if input_sizes[name] and not (ids_on_gpu and name == "ids"):
                                seq.copy(self.inputs.range(base + self.layout[name], input_sizes[name]), t.range(),
                                         input_sizes[name])
                    for part in segment:
                        part.record(seq)
        except BaseException:
            for seq in seqs:
                seq.close()
            raise
        return StageGraph(seqs, [p.layer for p in parts if p.layer is not None],
                          hosts if any(hosts) else [], n_tokens)

    def submit(self, g: StageGraph) -> int:
        """Submit a stage's part of a step (not waiting); with prefetched layers, interleave their
        uploads on the transfer queue; with host-planned experts, the host plans each such layer
        (after the routing) and computes its CPU experts while the GPU runs the rest of the
        layer. Returns how many layers were prefetched."""
        if g.hosts:
            previous = None
            for seq, host in zip(g.seqs, g.hosts):
                if host is not None:
                    self.host_experts.before(host, g.n_tokens, previous)
                seq.submit()
                previous = seq
            return 0
        if not g.prefetched:
            g.seqs[0].submit()
            return 0
        pf, compute = self.prefetch, self.device.compute
        n = len(g.prefetched)
        ready: dict[int, int] = {}
        free = [0] * pf.n_slots  # compute value after which each slot may be overwritten
        link = self.host_experts.link_gbps if self.host_experts is not None else None
        start = time.perf_counter()

        def upload(j: int) -> None:
            slot = pf.slot_of(g.prefetched[j])
            waits = [(compute.timeline, free[slot])] if free[slot] else []
            if link:   # paced: upload j may not end before j + 1 layers would have crossed the link
                wait = start + (j + 1) * pf.slot_bytes / (link * 1e9) - self._upload_seconds() - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            ready[j] = pf.upload(g.prefetched[j], waits)

        for j in range(min(pf.n_slots, n)):
            upload(j)
        g.seqs[0].submit(auto_wait=False)
        transfer = self.device.transfer
        for k in range(1, n + 1):
            value = g.seqs[k].submit([(transfer.timeline, ready[k - 1])], auto_wait=False)
            free[pf.slot_of(g.prefetched[k - 1])] = value
            if k - 1 + pf.n_slots < n:
                upload(k - 1 + pf.n_slots)
        return n

    def _upload_seconds(self) -> float:
        """How long one layer's upload takes over the real link (the measured rate; 0 unknown)."""
        rates = self.host_experts.rates if self.host_experts is not None else None
        real = rates.h2d_gbps if rates is not None else None
        return self.prefetch.slot_bytes / (real * 1e9) if real else 0.0

    def _release(self) -> None:
        for obj in (self.host_experts, self.staging, self.prefetch, self.inputs, self.scratch, self.state,
                    self.cache):
            if obj is not None:
                obj.close()
