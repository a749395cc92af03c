"""Engine: feeds token batches through a model, one recorded command sequence per batch shape.

Per step the host writes token ids, positions, KV cells and the attention mask into one
host-visible buffer and submits the sequence recorded for that shape (n_tokens, KV cells to
attend, logits wanted); the sequence starts by copying those inputs to the GPU and ends by
copying the logits back. Host work per step does not depend on the number of layers.

Greedy decoding keeps the token on the GPU (Engine.greedy): each step ends with an argmax that
writes the next token where the following step reads it and 4 bytes for the host, and the step
after is submitted before the host reads that token (inputs are double-buffered), so host work
overlaps the GPU's.

A model split by layers over several devices (Model.split) runs as one Stage per device
(stage.py), each with its layers' KV cache, recurrent state, activations and recorded part of
every graph; a step runs them in turn, the residual stream handed across (handoff.py). Prompts
of several micro-batches run as a pipeline over the stages (_pipelined, wavefront.py), and with
pipeline_steps so do the groups of sequences a step of several is split into (_groups); greedy
decoding reads each token back instead of chaining it on the GPU (separate devices share no
semaphore), writing the next step's other inputs while the last stage runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

import dataclasses

from ..errors import BufferTooLarge, ConfigError, VkrtError
from ..memory import F16, I32, Buffer, BufferRange, MemoryKind, Tensor
from ..model.loader import Model
from ..model.transformer import RecordOptions
from ..ops.argmax import MAX_PARTS, argmax
from ..ops.logit_adjust import logit_adjust, pack_table, table_words
from ..ops.token_mask import pack_masks, table_words as mask_table_words, token_mask
from ..ops.topk import scratch_words, top_candidates
from ..owned import Owned
from .handoff import Handoff
from .kv_cache import CellTable
from .logit_adjust import LogitAdjustments
from .recurrent_state import Checkpoint, RecurrentState
from .stage import Stage, StageGraph
from .state_group import StateGroup
from .wavefront import WaveStep, balanced_groups, run_wavefront, same_kernels

log = logging.getLogger("vkrt")

# attention covers the used cells rounded up to this, so shapes repeat; with flash attention to a
# power of two (at least this): the kernel stops at the live cells (kv_used), so the longer span
# costs only mask bytes (at most twice), and a growing context or a server's slots filling the
# cache record a few graphs per step size instead of one per 256 cells
KV_STEP = 256
# prompt chunks of more than PAD_FROM tokens run as a multiple of PAD_STEP (the GEMM's token tile)
# where that is free of side effects (flash attention, no recurrent state, no host experts): the
# extra tokens come first, see nothing, write one free cell and are dropped, so a server's
# prompts of new lengths reuse a few recorded graphs instead of recording one each
PAD_FROM, PAD_STEP = 16, 64
PAD_SEQ = -2   # the sequence id of padding tokens: no cell holds it
# an engine for several sequences (a server) runs its steps over at least this many cells: one
# graph per step shape until the slots' cells pass it (splits of flash attention left without
# live tiles only count themselves done; the mask's dead columns cost bytes only)
MULTI_SEQ_MIN_SPAN = 4096
CANDIDATES = 64   # the best logits Engine.candidates reads back (a sampler's top-k up to this)
CANDIDATE_ROWS = 64   # the most tokens a step reads candidates of (decode_candidates' batch)
ADJUST_CAP = 128   # logit adjustments (bias, penalties, DRY: tokens) a candidates row takes on the GPU


@dataclass
class _Graph:
    """The recorded forward pass of one shape: each stage's part of it (one stage on one device;
    a layer split runs them in order, handing the residual stream across)."""

    stages: list[StageGraph]
    opts: RecordOptions

    @property
    def seqs(self) -> list:
        return [seq for g in self.stages for seq in g.seqs]

    @property
    def prefetched(self) -> list[int]:
        return [il for g in self.stages for il in g.prefetched]

    def close(self) -> None:
        for g in self.stages:
            g.close()


@dataclass
class _Group:
    """Sequences of a step run as one (the whole step, or a group of its parts pipelined over a
    split's stages): their tokens, _prepare's keywords, what reads the group's outputs after it
    ran and what writes the tables its last stage reads (logit adjustments, token masks)."""

    ids: np.ndarray
    seqs: np.ndarray
    pos: np.ndarray
    n_seqs: int
    keywords: dict
    read: Callable[[], object]
    tables: Callable[[], None] = lambda: None


def _rows(values: list | None, r: range, rows: int) -> list | None:
    """values[r] (per part: adjustments or masks) padded with None to `rows` rows; None where
    no part in r has one."""
    if values is None or all(v is None for v in values[r.start:r.stop]):
        return None
    return list(values[r.start:r.stop]) + [None] * (rows - len(r))


@dataclass
class StepStats:
    tokens: int = 0
    seconds: float = 0.0
    graphs_recorded: int = 0
    record_seconds: float = 0.0     # recording graphs (a shape seen for the first time, or evicted)
    layers_prefetched: int = 0
    steps: int = 0
    gpu_wait_seconds: float = 0.0   # blocked waiting for the GPU; the rest of `seconds` is host work

    @property
    def host_seconds_per_step(self) -> float:
        return (self.seconds - self.gpu_wait_seconds) / self.steps if self.steps else 0.0


class Engine(Owned):
    """Runs `model` with a KV cache of `n_ctx` cells, ubatches of at most `n_ubatch` tokens.
    Models with Gated DeltaNet layers also keep a recurrent state for each of `n_seq_max`
    sequences (ids 0..n_seq_max-1) and a pool of `n_checkpoints` saved states in host memory.
    Recorded step graphs are kept for `max_graphs` shapes (default 16, and 6 a sequence more: a
    server's decode steps take every batch size up to its slots, with and without candidates,
    and its mixed steps several sizes of prompt and of output; twice that with pipeline_steps).
    pipeline_steps: on a layer split, run a step of several sequences (decode, decode_candidates,
    mixed) as groups of whole sequences pipelined over the stages (see _groups), not as one pass
    stage after stage."""

    def __init__(self, model: Model, *, n_ctx: int = 4096, n_batch: int = 2048, n_ubatch: int = 512,
                 flash_attn: bool = True, kv_type=F16, max_graphs: int | None = None, replay: bool = True,
                 prefetch_slots: int | None = None, stage_experts: bool | None = None,
                 expert_cache: int | None = None, n_seq_max: int = 1, n_checkpoints: int = 0,
                 pipeline_steps: bool = False):
        super().__init__("engine")
        self.pipeline_steps = pipeline_steps
        self.model = model
        self.device = dev = model.device
        cfg = model.cfg
        if n_ubatch > n_batch:
            n_ubatch = n_batch
        self.n_ctx, self.n_batch, self.n_ubatch = n_ctx, n_batch, n_ubatch
        self.flash_attn = flash_attn
        # pipelined steps record each group's shape for both copies of the inputs (parity)
        self.max_graphs = max_graphs if max_graphs is not None else \
            (16 + 6 * max(0, n_seq_max - 1)) * (2 if pipeline_steps else 1)
        self._min_span = MULTI_SEQ_MIN_SPAN if n_seq_max > 1 else KV_STEP
        self.replay = replay  # False: record every step afresh (to compare against replaying)
        self._graphs: dict[tuple, _Graph] = {}
        self.stages: list[Stage] = []
        self.handoffs: list[Handoff] = []
        self._logits = self.prefetch = self.staging = None
        self._tokens = self._argmax_part = self._top = self._adjust = self._hidden = self._masks = None
        self._top_scratch = ()
        self.state: RecurrentState | StateGroup | None = None
        split = model.split
        devices, ranges = (split.devices, split.ranges) if split is not None else ([dev], [range(cfg.n_layer)])
        try:
            cells = CellTable(n_ctx)
            for k, (d, layers) in enumerate(zip(devices, ranges)):
                self.stages.append(Stage(model, d, layers, cells, n_ctx=n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn,
                                         kv_type=kv_type, n_seq_max=n_seq_max, n_checkpoints=n_checkpoints,
                                         output=k == len(devices) - 1))
            for a, b in zip(self.stages, self.stages[1:]):
                self.handoffs.append(Handoff(a.device, b.device, 4 * cfg.n_embd * n_ubatch))
            main = self.stages[-1]
            self.transformer, self.scratch, self.cache = main.transformer, main.scratch, main.cache
            states = [st.state for st in self.stages if st.state is not None]
            self.state = states[0] if len(states) == 1 else StateGroup(states) if states else None
            self._layout, self._inputs_size = main.layout, main.inputs_size
            self._tokens = Buffer(dev, 64, MemoryKind.READBACK, label="greedy tokens")
            self._argmax_part = Tensor.empty(dev, I32, (2 * MAX_PARTS,), name="argmax partials")
            self.candidate_rows = min(CANDIDATE_ROWS, n_ubatch)   # the most tokens decode_candidates takes
            words = scratch_words(cfg.vocab_size, CANDIDATES, self.candidate_rows)
            self._top_scratch = tuple(Tensor.empty(dev, I32, (words,), name="top-k scratch") for _ in range(2))
            self._top = Buffer(dev, 8 * CANDIDATES * self.candidate_rows, MemoryKind.READBACK, label="top-k candidates")
            # written by the host each adjusted step, read by logit_adjust where it lies (a few
            # hundred bytes of it, not worth a copy to VRAM)
            self._adjust = Buffer(dev, 4 * table_words(self.candidate_rows, ADJUST_CAP), MemoryKind.HOST,
                                  label="logit adjustments")
            self._logits = Buffer(dev, 4 * cfg.vocab_size * n_ubatch, MemoryKind.READBACK, label="logits readback")
            for st in self.stages:
                st.add_experts(n_ubatch, stage_experts, expert_cache, prefetch_slots)
            self.staging, self.prefetch = main.staging, main.prefetch
        except BufferTooLarge as exc:
            self.close()
            raise ConfigError(f"{exc}: activations, logits and the attention mask grow with the micro-batch and the "
                              f"context; lower -ub (now {n_ubatch}) or -c (now {n_ctx})") from None
        except BaseException:
            self.close()
            raise
        self.stats = StepStats()

    @property
    def split(self) -> bool:
        """Whether the model runs on several devices (a layer split: one stage each)."""
        return len(self.stages) > 1

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV cache on every device."""
        return sum(st.cache.nbytes for st in self.stages)

    def expert_cache_hit_rate(self) -> float | None:
        """Share of the experts decode steps chose that were already cached, over every stage
        (None: no expert cache)."""
        counts = [c for st in self.stages if st.staging is not None and (c := st.staging.hit_counts()) is not None]
        if not counts:
            return None
        hits, misses = sum(h for h, _ in counts), sum(m for _, m in counts)
        return hits / (hits + misses) if hits + misses else 0.0

    # -- graphs ------------------------------------------------------------------------------------
    @property
    def recurrent(self) -> bool:
        """Whether the model keeps a recurrent state (it cannot be rewound: see save_state)."""
        return self.state is not None

    def _graph(self, n_tokens: int, n_kv: int, all_logits: bool, n_seqs: int = 1,
               chain: tuple[int, bool] | None = None, top: bool = False, adjust: bool = False,
               out_rows: int = 0, hidden: bool = False, masked: bool = False, parity: int = 0,
               fa_plan: int = 0) -> _Graph:
        """The recorded pass of a shape. chain = (parity, ids_on_gpu): a greedy one-token step that
        reads its inputs from copy `parity`, its token from the GPU (the last step's argmax) or
        the host, and ends with the argmax of its logits instead of reading them back. top: the
        step reads back the CANDIDATES best logits of its last token instead of the row; adjust:
        after applying the logit adjustment table the host wrote, masked: then the token masks the
        host wrote (grammars; top steps only). out_rows > 0:
        the logits of the tokens the out_ids input names, instead of the last or all. hidden:
        every token's normed final state is read back instead of any logits (hidden_states).
        parity: the copy of the inputs (and of a split's handoffs) a step that is not a chain
        step reads (pipelined micro-batches alternate). fa_plan: flash attention splits the KV
        cells as a step of this many tokens would (a group of a pipelined step; 0: this one's)."""
        n_seqs = n_seqs if self.recurrent else 1   # only the DeltaNet layers care how tokens group
        key = (n_tokens, n_kv, all_logits, n_seqs, chain, out_rows, top) + (("adjust",) if adjust else ()) \
            + (("hidden",) if hidden else ()) + (("masked",) if masked else ()) \
            + ((f"parity {parity}",) if parity and chain is None else ()) \
            + ((f"attention split as {fa_plan} tokens",) if fa_plan and fa_plan != n_tokens else ())
        g = self._graphs.get(key)
        if g is not None and self.replay:
            self._graphs[key] = self._graphs.pop(key)   # most recently used last: eviction takes the oldest
            return g
        if g is not None:
            self._graphs.pop(key).close()
        if len(self._graphs) >= self.max_graphs:  # forget the oldest shape
            old = next(iter(self._graphs))
            self._graphs.pop(old).close()
        t0 = time.perf_counter()
        row_bytes = 4 * self.model.cfg.vocab_size
        read = lambda seq, n, row: seq.copy(   # noqa: E731
            self.scratch.logits.range(), self._logits.range(row * row_bytes, n * row_bytes), n * row_bytes)
        parity, ids_on_gpu = chain or (parity, False)
        if chain is not None:
            token = Tensor.on(BufferRange(self._tokens, 16 * parity, 4), I32, (1,), name="greedy token")
            read = lambda seq, n, row: argmax(seq, self.scratch.logits.slice(1, 0, 1).view(   # noqa: E731
                (self.model.cfg.vocab_size,)), self._argmax_part, self.scratch.ids.slice(0, 0, 1), token)
        if top:
            per_row = 8 * CANDIDATES

            def read_top(seq, n, row):
                logits = self.scratch.logits.slice(1, 0, n)
                if adjust:   # candidates rows fit one slice of logits: row is 0
                    words = table_words(n, ADJUST_CAP)
                    logit_adjust(seq, logits, Tensor.on(self._adjust.range(0, 4 * words), I32, (words,),
                                                        name="logit adjustments"), ADJUST_CAP)
                if masked:
                    words = mask_table_words(n, self.model.cfg.vocab_size)
                    token_mask(seq, logits, Tensor.on(self._mask_table().range(0, 4 * words), I32, (words,),
                                                      name="token masks"))
                top_candidates(seq, logits, CANDIDATES, self._top_scratch,
                               Tensor.on(self._top.range(row * per_row, n * per_row), I32, (2 * CANDIDATES * n,),
                                         name="candidates"))
            read = read_top
        opts = RecordOptions(n_tokens, n_kv, all_logits, self.flash_attn, n_seqs, read_logits=read, out_rows=out_rows,
                             fa_plan_tokens=fa_plan)
        if hidden:
            opts.read_logits = None
            opts.read_hidden = lambda seq, cur: seq.copy(cur.range(), self._hidden.range(0, cur.nbytes), cur.nbytes)
        cfg = self.model.cfg
        sizes = {"ids": 4 * n_tokens, "pos": 4 * n_tokens * cfg.pos_streams,
                 "cells": 4 * n_tokens, "slots": 4 * n_seqs, "mask": 2 * n_kv * n_tokens,
                 "mask_swa": 2 * n_kv * n_tokens, "kv_used": 4, "out_ids": 4 * out_rows}
        x_bytes = 4 * cfg.n_embd * n_tokens
        parts: list[StageGraph] = []
        try:
            for k, st in enumerate(self.stages):
                st_opts = opts
                if self.split:   # the residual stream arrives from the stage before and leaves for the next
                    st_opts = dataclasses.replace(
                        opts, layers=st.layers,
                        receive=(lambda seq, x, h=self.handoffs[k - 1]: seq.copy(h.receive(parity, x_bytes), x.range(),
                                                                                 x_bytes)) if k else None,
                        send=(lambda seq, x, h=self.handoffs[k]: seq.copy(x.range(), h.send(parity, x_bytes),
                                                                          x_bytes)) if k < len(self.handoffs) else None)
                use_prefetch = st.prefetch.active and n_tokens * cfg.n_expert_used >= 2 * cfg.n_expert
                use_staging = not use_prefetch and n_tokens <= st.device.tuning.mv_max_n
                stage_parts = st.transformer.parts(st.scratch, st.cache, st_opts,
                                                   st.prefetch.experts() if use_prefetch else None,
                                                   st.staging.tensors() if use_staging else None, state=st.state)
                label = f"forward T={n_tokens} kv={n_kv}" + (f" on {st.device.label}" if self.split else "")
                parts.append(st.record(stage_parts, sizes, parity, ids_on_gpu, label))
        except BaseException:
            for part in parts:
                part.close()
            raise
        g = self._graphs[key] = _Graph(parts, opts)
        self.stats.graphs_recorded += 1
        seconds = time.perf_counter() - t0
        self.stats.record_seconds += seconds
        log.debug("recorded the step graph of %d token(s) over %d cells (logits %s, %d sequence(s)%s%s) in %.0f ms",
                  n_tokens, n_kv, f"of {out_rows}" if out_rows else "all" if all_logits else "last", n_seqs,
                  ", chained" if chain else "",
                  ", candidates" if top else "", seconds * 1e3)
        return g

    def _run(self, g: _Graph, parity: int = 0, wait_last: bool = True) -> None:
        """Submit a graph and wait for it (wait_last False: for all but its last stage): stage by
        stage, each after the last one finished and its activations were handed across (copy
        `parity` of the handoffs)."""
        for k, (st, part) in enumerate(zip(self.stages, g.stages)):
            self.stats.layers_prefetched += st.submit(part)
            if wait_last or k + 1 < len(self.stages):
                self._wait(part.seqs[-1])
            if k < len(self.handoffs):
                self.handoffs[k].carry(parity, 4 * self.model.cfg.n_embd * g.opts.n_tokens)

    def _wait(self, seq) -> None:
        t0 = time.perf_counter()
        seq.wait()
        self.stats.gpu_wait_seconds += time.perf_counter() - t0

    # -- evaluation --------------------------------------------------------------------------------
    def eval(self, tokens, seq_id: int = 0, all_logits: bool = False) -> np.ndarray:
        """Append `tokens` to sequence `seq_id`; returns the logits of its last token
        ([vocab]) or of every token ([n, vocab]) with all_logits."""
        tokens = np.asarray(tokens, dtype=np.int32)
        if tokens.size == 0:
            raise VkrtError("eval needs at least one token")
        self._check_tokens(tokens)
        start = self.cache.cells.length(seq_id)
        if self.split and tokens.size > self.n_ubatch:
            steps = [(tokens[u0:u0 + self.n_ubatch], np.full(min(self.n_ubatch, tokens.size - u0), seq_id, np.int32),
                      np.arange(u0, min(u0 + self.n_ubatch, tokens.size), dtype=np.int32) + start)
                     for u0 in range(0, tokens.size, self.n_ubatch)]
            outs = self._pipelined(steps, all_logits)
            return np.concatenate(outs) if all_logits else outs[-1][-1]
        outs = []
        for b0 in range(0, tokens.size, self.n_batch):
            batch = tokens[b0:b0 + self.n_batch]
            for u0 in range(0, batch.size, self.n_ubatch):
                ub = batch[u0:u0 + self.n_ubatch]
                last = b0 + u0 + ub.size == tokens.size
                out = self._step(ub, np.full(ub.size, seq_id, np.int32),
                                 np.arange(ub.size, dtype=np.int32) + start + b0 + u0, all_logits, n_seqs=1)
                if all_logits or last:
                    outs.append(out)
        return np.concatenate(outs) if all_logits else outs[-1][-1]

    def _pipelined(self, steps: list[tuple], all_logits: bool) -> list[np.ndarray]:
        """Micro-batches `steps` ((ids, seqs, pos) of one sequence each) through the stages of a
        split as a wavefront (wavefront.py), each taking its KV cells as it enters the first
        stage, as on one device. Returns each micro-batch's logits: every row, or the last."""
        vocab = self.model.cfg.vocab_size
        outs: list = [None] * len(steps)
        counted = [time.perf_counter()]

        def prepare(u: int) -> WaveStep:
            ids, seqs, pos = steps[u]
            pad, (ids, seqs, pos) = self._padded(ids, seqs, pos)
            g, slots = self._prepare(ids, seqs, pos, all_logits, parity=u % 2, broadcast=False)
            self._advance(slots, ids.size)

            def finish() -> None:
                rows = ids.size if all_logits else 1
                outs[u] = self._logits.read(np.float32, 4 * vocab * rows).reshape(rows, vocab)[pad if all_logits else 0:]
                now = time.perf_counter()
                self._count(ids.size - pad, now - counted[0])
                counted[0] = now
            return WaveStep(g, self._step_inputs(u % 2), u % 2, finish)

        self.stats.layers_prefetched += run_wavefront(self.stages, self.handoffs, len(steps), prepare, self._wait)
        return outs

    def _step_inputs(self, parity: int) -> bytes:
        """A copy of the step inputs the host wrote for the first stage (copy `parity`)."""
        base = parity * self._inputs_size
        return self.stages[0].inputs.host_bytes[base:base + self._inputs_size].copy()

    def hidden_states(self, tokens, seq_id: int = 0) -> np.ndarray:
        """Append `tokens` to sequence `seq_id`; returns every token's final hidden state after
        the output norm, [n, n_embd] (what llama.cpp returns as a decoder model's embeddings:
        the input of the output matrix, which these steps do not run)."""
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if tokens.size == 0:
            raise VkrtError("hidden_states needs at least one token")
        self._check_tokens(tokens)
        n_embd = self.model.cfg.n_embd
        if self._hidden is None:
            self._hidden = Buffer(self.device, 4 * n_embd * self.n_ubatch, MemoryKind.READBACK, label="hidden states")
        start = self.cache.cells.length(seq_id)
        rows = []
        for u0 in range(0, tokens.size, self.n_ubatch):
            t0 = time.perf_counter()
            ub = tokens[u0:u0 + self.n_ubatch]
            pad, (ids, seqs, pos) = self._padded(ub, np.full(ub.size, seq_id, np.int32),
                                                 np.arange(ub.size, dtype=np.int32) + start + u0)
            g, slots = self._prepare(ids, seqs, pos, False, hidden=True)
            self._run(g)
            self._advance(slots, ub.size)
            rows.append(self._hidden.read(np.float32, 4 * n_embd * ids.size).reshape(ids.size, n_embd)[pad:])
            self._count(ub.size, time.perf_counter() - t0)
        return np.concatenate(rows)

    def decode(self, batch: list[tuple[int, int]]) -> np.ndarray:
        """One step for several sequences at once (continuous batching): batch holds
        (seq_id, token) pairs; returns each token's next-token logits, [len(batch), vocab]."""
        if not batch:
            raise VkrtError("decode needs at least one (sequence, token) pair")
        if len(batch) > self.n_ubatch:
            raise VkrtError(f"decode of {len(batch)} sequences exceeds the micro-batch of {self.n_ubatch}")
        seqs, ids, pos = self._decode_inputs(batch)
        t0 = time.perf_counter()
        vocab = self.model.cfg.vocab_size

        def group(r: range) -> _Group:
            n = len(r)
            return _Group(ids[r.start:r.stop], seqs[r.start:r.stop], pos[r.start:r.stop], n, dict(all_logits=True),
                          lambda: self._logits.read(np.float32, 4 * vocab * n).reshape(n, vocab))

        outs = self._run_groups([group(r) for r in self._groups([1] * len(batch))])
        self._count(len(batch), time.perf_counter() - t0)
        return np.concatenate(outs)

    def _decode_inputs(self, batch: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sequences, tokens, positions) of a decode batch, checked."""
        seqs = np.array([s for s, _ in batch], np.int32)
        if len(set(seqs.tolist())) != len(seqs):
            raise VkrtError("decode takes one token per sequence")
        ids = np.array([t for _, t in batch], np.int32)
        self._check_tokens(ids)
        return seqs, ids, np.array([self.cache.cells.length(int(s)) for s in seqs], np.int32)

    def _check_tokens(self, ids: np.ndarray) -> None:
        vocab = self.model.cfg.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:
            raise VkrtError(f"token ids must be in [0, {vocab}); got {int(ids.min())}..{int(ids.max())}")

    def sequence_length(self, seq_id: int) -> int:
        """Tokens of `seq_id` held in the KV cache."""
        return self.cache.cells.length(seq_id)

    @property
    def host_experts(self) -> bool:
        """Whether MoE layers read their experts from host memory: a prompt step then streams them
        over the bus (or reads them in place), a cost that hardly depends on its size."""
        return any(st.prefetch.layers or st.staging.layers for st in self.stages)

    @property
    def pads_prompts(self) -> bool:
        """Whether prompt steps run padded (PAD_FROM): flash attention, no recurrent state, no
        host experts."""
        return self.flash_attn and not self.recurrent and not self.host_experts

    def padded_tokens(self, n: int) -> int:
        """The tokens a prompt step of n runs as: n, or with padding a multiple of PAD_STEP up to
        the micro-batch."""
        if n <= PAD_FROM or not self.pads_prompts:
            return n
        return min(self.n_ubatch, -(-n // PAD_STEP) * PAD_STEP)

    def record_prompt_step(self, n_tokens: int) -> None:
        """Record, not run, the graph of a step of n_tokens prompt tokens of one sequence over
        an empty cache that reads back its last token's candidates (as mixed with top): the
        pipelines such a step takes are created without its run (with host experts, a stream of
        every expert)."""
        longest = min(self.n_ubatch, self.n_ctx)
        if not 0 < n_tokens <= longest:
            raise VkrtError(f"a prompt step takes 1 to {longest} tokens, got {n_tokens}")
        n = self.padded_tokens(n_tokens)
        self._graph(n, self.kv_span(n), False, top=True, out_rows=self.out_rows(1, self.candidate_rows))

    def _step(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray, all_logits: bool,
              n_seqs: int = 1) -> np.ndarray:
        t0 = time.perf_counter()
        n = ids.size
        pad, (ids, seqs, pos) = self._padded(ids, seqs, pos) if n_seqs == 1 else (0, (ids, seqs, pos))
        g, slots = self._prepare(ids, seqs, pos, all_logits, n_seqs)
        self._run(g)
        self._advance(slots, ids.size // n_seqs)
        n_out = ids.size if all_logits else 1
        vocab = self.model.cfg.vocab_size
        logits = self._logits.read(np.float32, 4 * vocab * n_out).reshape(n_out, vocab)
        self._count(n, time.perf_counter() - t0)
        return logits[pad:] if all_logits else logits

    def _padded(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray) -> tuple[int, tuple]:
        """(padding tokens, (ids, seqs, pos) with them first) for a step of ids.size tokens (see
        padded_tokens; none when no cell would be left for them). Padding comes first: the last
        token, whose logits a step reads, stays a real one."""
        n = ids.size
        pad = self.padded_tokens(n) - n
        if not pad or self.cache.cells.n_free() <= n:
            return 0, (ids, seqs, pos)
        return pad, (np.concatenate([np.zeros(pad, np.int32), ids]),
                     np.concatenate([np.full(pad, PAD_SEQ, np.int32), seqs]),
                     np.concatenate([np.zeros(pad, np.int32), pos]))

    def _count(self, tokens: int, seconds: float) -> None:
        """One step of `tokens` tokens that kept the host `seconds` (GPU waits included) in the stats."""
        self.stats.tokens += tokens
        self.stats.steps += 1
        self.stats.seconds += seconds

    def _take_cells(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray, n_seqs: int) -> tuple:
        """Check a step's sequences (a recurrent state must be at the step's positions) and take
        its KV cells; returns (each token's cell, the sequence of each group of tokens)."""
        slots = seqs[::ids.size // n_seqs]   # the sequence of each group of tokens
        if self.state is not None:
            for s, p in zip(slots.tolist(), pos[::ids.size // n_seqs].tolist()):
                self.state.check_slot(s)
                if self.state.length[s] != p:
                    raise VkrtError(f"sequence {s}: its recurrent state holds {self.state.length[s]} tokens but "
                                    f"the next token is at position {p} (a recurrent state cannot be rewound; "
                                    f"restore a checkpoint or reset the sequence)")
        cells_tab = self.cache.cells
        cells = np.empty(ids.size, np.int32)
        for s in np.unique(seqs):
            sel = seqs == s
            if s != PAD_SEQ:
                cells[sel] = cells_tab.allocate(int(s), pos[sel])
        if (seqs == PAD_SEQ).any():   # padding writes its K and V to a free cell no token attends (_step left one)
            cells[seqs == PAD_SEQ] = cells_tab.highest_free()
        return cells, slots

    def _prepare(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray, all_logits: bool, n_seqs: int = 1,
                 chain: tuple[int, bool] | None = None, top: bool = False, adjust: bool = False,
                 out: np.ndarray | None = None, hidden: bool = False, masked: bool = False, parity: int = 0,
                 broadcast: bool = True, taken: tuple | None = None, fa_plan: int = 0):
        """Check the step, take its KV cells, write its inputs (copy chain[0] for a chain step,
        else copy `parity`) and find its graph; returns (graph, the sequence of each group of
        tokens). out: the tokens whose logits the step computes (default: the last, or all with
        all_logits). broadcast: write the inputs of every stage of a split (else the first's
        only: a pipelined step writes the others' when they take it up). taken: (cells, slots)
        from _take_cells (the step's cells taken already). fa_plan: as _graph's."""
        cells, slots = taken or self._take_cells(ids, seqs, pos, n_seqs)
        cells_tab = self.cache.cells
        n = ids.size
        used = cells_tab.used_end()
        n_kv = self.kv_span(used)
        lay, cfg = self._layout, self.model.cfg
        base = (chain[0] if chain else parity) * self._inputs_size
        host = self.stages[0].inputs.host_bytes[base:base + self._inputs_size]
        host[lay["ids"]:lay["ids"] + 4 * n] = ids.view(np.uint8)
        streams = pos   # multi-section RoPE on text: the t, h and w streams hold the position, e is 0
        if cfg.pos_streams > 1:
            streams = np.concatenate([pos, pos, pos, np.zeros_like(pos)])
        host[lay["pos"]:lay["pos"] + streams.nbytes] = streams.view(np.uint8)
        host[lay["cells"]:lay["cells"] + 4 * n] = cells.view(np.uint8)
        host[lay["slots"]:lay["slots"] + 4 * n_seqs] = slots.astype(np.int32).view(np.uint8)
        if "mask" in lay:
            mask = cells_tab.mask(seqs, pos, n_kv, n, used=used)
            host[lay["mask"]:lay["mask"] + mask.nbytes] = mask.reshape(-1).view(np.uint8)
        if "mask_swa" in lay:
            swa = cells_tab.mask(seqs, pos, n_kv, n, window=cfg.sliding_window, used=used)
            host[lay["mask_swa"]:lay["mask_swa"] + swa.nbytes] = swa.reshape(-1).view(np.uint8)
        if "kv_used" in lay:
            host[lay["kv_used"]:lay["kv_used"] + 4] = np.array([used], np.int32).view(np.uint8)
        if out is not None:
            host[lay["out_ids"]:lay["out_ids"] + 4 * out.size] = out.astype(np.int32).view(np.uint8)
        for st in self.stages[1:] if broadcast else ():   # each stage of a split reads them from its own device
            st.inputs.host_bytes[base:base + self._inputs_size] = host
        return self._graph(n, n_kv, all_logits, n_seqs, chain, top, adjust, 0 if out is None else out.size,
                           hidden, masked, parity, fa_plan), slots

    def kv_span(self, used: int) -> int:
        """The KV cells a step attends over when `used` are in use (one past the highest): with
        flash attention a power of two (at least MULTI_SEQ_MIN_SPAN in an engine for several
        sequences), else a multiple of KV_STEP; never more than the context."""
        if self.flash_attn:
            span = max(self._min_span, 1 << (used - 1).bit_length())
        else:
            span = -(-used // KV_STEP) * KV_STEP
        return min(span, self.n_ctx)

    def _advance(self, slots: np.ndarray, n: int) -> None:
        if self.state is not None:
            for s in slots.tolist():
                self.state.length[s] += n

    def candidates(self, token: int, seq_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Append `token` to `seq_id` and return the CANDIDATES best next-token logits, best first
        (ties: the lower id), and their token ids: what a top-k sampler needs, picked on the GPU
        (the host reads 512 bytes, not the whole row)."""
        values, ids = self.decode_candidates([(seq_id, token)])
        return values[0], ids[0]

    def decode_candidates(self, batch: list[tuple[int, int]], adjustments: list[LogitAdjustments | None] | None = None,
                          masks: list[np.ndarray | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """decode() that returns each token's CANDIDATES best next-token logits and their ids
        ([len(batch), k] each, best first) instead of the rows; at most candidate_rows tokens.
        adjustments: per token, the logit bias / penalties / DRY to apply to its row on the GPU
        first (None: nothing; at most ADJUST_CAP tokens each). masks: per token, the allowed-token
        bitmask of a grammar (vkrt/engine/grammar.py) applied after them (None: every token)."""
        if not batch or len(batch) > self.candidate_rows:
            raise VkrtError(f"decode_candidates takes 1 to {self.candidate_rows} (sequence, token) pairs, "
                            f"got {len(batch)}")
        self._check_rows(adjustments, masks, len(batch), "decode_candidates")
        seqs, ids, pos = self._decode_inputs(batch)
        t0 = time.perf_counter()

        def group(r: range) -> _Group:
            n = len(r)
            adj, msk = _rows(adjustments, r, n), _rows(masks, r, n)
            adjust, masked = adj is not None, msk is not None
            return _Group(ids[r.start:r.stop], seqs[r.start:r.stop], pos[r.start:r.stop], n,
                          dict(all_logits=True, top=True, adjust=adjust, masked=masked),
                          lambda: self._read_candidates(n), lambda: self._write_tables(adj, msk, n))

        outs = self._run_groups([group(r) for r in self._groups([1] * len(batch))])
        self._count(len(batch), time.perf_counter() - t0)
        return np.concatenate([v for v, _ in outs]), np.concatenate([i for _, i in outs])

    def mixed(self, parts: list[tuple[int, object]], adjustments: list[LogitAdjustments | None] | None = None,
              top: bool = False, masks: list[np.ndarray | None] | None = None):
        """One step over several sequences' tokens together (a server's decode tokens and prompt
        chunks in one micro-batch): part (seq_id, tokens) appends tokens to seq_id. Returns the
        next-token logits after each part's last token, [len(parts), vocab]; with `top` each
        part's CANDIDATES best (values, ids) instead, as decode_candidates (at most candidate_rows
        parts; adjustments and masks per part). A model with a recurrent state takes parts of one size
        (its DeltaNet layers read a step as equal runs of tokens, a sequence each): one token a part
        (decode), or several prompts' chunks of one length read together."""
        if not parts:
            raise VkrtError("a step needs at least one (sequence, tokens) part")
        seq_ids = [int(s) for s, _ in parts]
        if len(set(seq_ids)) != len(seq_ids):
            raise VkrtError("a step takes one part per sequence")
        toks = [np.asarray(t, np.int32).reshape(-1) for _, t in parts]
        sizes = np.array([t.size for t in toks])
        n = int(sizes.sum())
        if sizes.min() == 0 or n > self.n_ubatch:
            raise VkrtError(f"a step takes 1 to {self.n_ubatch} tokens (the micro-batch), at least one a part; "
                            f"got {sizes.tolist()}")
        if self.recurrent and sizes.min() != sizes.max():
            raise VkrtError(f"a model with a recurrent state takes parts of one size a step (its DeltaNet layers "
                            f"read a step as equal runs of tokens, a sequence each); got sizes {sizes.tolist()}")
        if top and len(parts) > self.candidate_rows:
            raise VkrtError(f"candidates are read for at most {self.candidate_rows} parts a step, got {len(parts)}")
        if top:
            self._check_rows(adjustments, masks, len(parts), "mixed")
        self._check_tokens(np.concatenate(toks))
        vocab = self.model.cfg.vocab_size
        t0 = time.perf_counter()
        pos = [np.arange(t.size, dtype=np.int32) + self.cache.cells.length(s) for s, t in zip(seq_ids, toks)]
        cap = self.candidate_rows if top else self.n_ubatch   # the most output rows

        def group(r: range) -> _Group:
            k = len(r)
            ids, seqs = np.concatenate(toks[r.start:r.stop]), np.repeat(np.array(seq_ids[r.start:r.stop], np.int32),
                                                                         sizes[r.start:r.stop])
            pad, (ids, seqs, p) = self._padded(ids, seqs, np.concatenate(pos[r.start:r.stop]))
            rows = self.out_rows(k, cap)
            out = np.cumsum(sizes[r.start:r.stop]) - 1 + pad
            out = np.concatenate([out, np.full(rows - out.size, out[-1])])   # the extra rows repeat the last
            adj, msk = (_rows(adjustments, r, rows), _rows(masks, r, rows)) if top else (None, None)
            adjust, masked = adj is not None, msk is not None

            def read():
                if top:
                    values, cand = self._read_candidates(rows)
                    return values[:k], cand[:k]
                return self._logits.read(np.float32, 4 * vocab * rows).reshape(rows, vocab)[:k]
            return _Group(ids, seqs, p, k if self.recurrent else 1,
                          dict(all_logits=False, top=top, adjust=adjust, out=out, masked=masked), read,
                          lambda: self._write_tables(adj, msk, rows))

        outs = self._run_groups([group(r) for r in self._groups(sizes.tolist(), pads=True,
                                                                  rows=lambda k: self.out_rows(k, cap))])
        self._count(n, time.perf_counter() - t0)
        if top:
            return np.concatenate([v for v, _ in outs]), np.concatenate([i for _, i in outs])
        return np.concatenate(outs)

    def _groups(self, sizes: list[int], pads: bool = False, rows: Callable[[int], int] | None = None) -> list[range]:
        """The parts (sizes: tokens each) of a step in the groups it runs as: with pipeline_steps
        on a split, in as many groups of whole parts as there are stages, run as a wavefront,
        where every group runs the kernels the whole step would (same_kernels; also the output
        matrix's over rows(parts) columns where that is not a column a token) and, for a step
        that `pads` its prompt tokens (mixed), none is padded; else one."""
        whole = [range(len(sizes))]
        if not (self.pipeline_steps and self.split and len(sizes) > 1):
            return whole
        groups = balanced_groups(sizes, min(len(self.stages), len(sizes)))
        n = sum(sizes)
        tunings = [st.device.tuning for st in self.stages]
        moe = self.model.cfg.n_expert > 0
        if pads and self.padded_tokens(n) != n:
            return whole
        for r in groups:
            m = sum(sizes[r.start:r.stop])
            if not same_kernels(tunings, moe, n, m) or pads and self.padded_tokens(m) != m:
                return whole
            if rows is not None and not same_kernels(tunings, False, rows(len(sizes)), rows(len(r))):
                return whole
        return groups

    def _run_groups(self, groups: list[_Group]) -> list:
        """Run one step as `groups`: one group as a step; several as a wavefront through the
        stages (wavefront.py), group g on stage k while group g + 1 runs on stage k - 1. The
        KV cells are taken first, those the whole step would take: each group attends over the
        span, and its keys lie in the cells, of the whole step, and flash attention splits them
        as the whole step's would.
        Returns each group's outputs."""
        if len(groups) == 1:
            gr = groups[0]
            gr.tables()
            g, slots = self._prepare(gr.ids, gr.seqs, gr.pos, n_seqs=gr.n_seqs, **gr.keywords)
            self._run(g)
            self._advance(slots, gr.ids.size // gr.n_seqs)
            return [gr.read()]
        # the whole step's cells, taken as one step takes them (a sequence's cell decides where its
        # keys sit in the cache, so the order attention sums them in)
        cells, _ = self._take_cells(*(np.concatenate([getattr(gr, f) for gr in groups]) for f in ("ids", "seqs", "pos")),
                                    sum(gr.n_seqs for gr in groups))
        ends = np.cumsum([0] + [gr.ids.size for gr in groups])
        taken = [(cells[a:b], gr.seqs[::gr.ids.size // gr.n_seqs]) for gr, a, b in zip(groups, ends, ends[1:])]
        outs: list = [None] * len(groups)

        def prepare(u: int) -> WaveStep:
            gr = groups[u]
            g, _ = self._prepare(gr.ids, gr.seqs, gr.pos, n_seqs=gr.n_seqs, parity=u % 2, broadcast=False,
                                 taken=taken[u], fa_plan=int(ends[-1]), **gr.keywords)
            return WaveStep(g, self._step_inputs(u % 2), u % 2, lambda: outs.__setitem__(u, gr.read()), gr.tables)

        self.stats.layers_prefetched += run_wavefront(self.stages, self.handoffs, len(groups), prepare, self._wait)
        for gr, (_, slots) in zip(groups, taken):
            self._advance(slots, gr.ids.size // gr.n_seqs)
        return outs

    def _check_rows(self, adjustments: list | None, masks: list | None, n: int, what: str) -> None:
        for name, rows in (("adjustments", adjustments), ("token masks", masks)):
            if rows is not None and len(rows) != n:
                raise VkrtError(f"{what}: {len(rows)} {name} for {n} tokens")

    def _write_tables(self, adjustments: list | None, masks: list | None, rows: int) -> None:
        """The logit adjustments and token masks of a step's `rows` rows (None: none)."""
        if adjustments is not None:
            self._write_adjustments(adjustments, rows)
        if masks is not None:
            self._write_masks(masks, rows)

    @staticmethod
    def out_rows(n: int, cap: int) -> int:
        """The logits rows a step of n parts computes: n rounded up to a power of two up to
        PAD_FROM, past it to a multiple of PAD_FROM (so a server's steps reuse a few graphs),
        at most cap."""
        rows = 1 << (n - 1).bit_length() if n <= PAD_FROM else -(-n // PAD_FROM) * PAD_FROM
        return max(n, min(rows, cap))

    def _write_adjustments(self, adjustments: list, rows: int) -> None:
        """The table logit_adjust reads: a count a row, then ADJUST_CAP entries a row."""
        if len(adjustments) != rows:
            raise VkrtError(f"decode_candidates: {len(adjustments)} adjustments for {rows} tokens")
        words = pack_table(rows, ADJUST_CAP, [None if a is None else a.words() for a in adjustments])
        self._adjust.host_bytes[:words.nbytes] = words.view(np.uint8)

    def _write_masks(self, masks: list | None, rows: int) -> bool:
        """The table token_mask reads (a flag a row, then its bitmask); whether any row has a mask."""
        if masks is None or all(m is None for m in masks):
            return False
        if len(masks) != rows:
            raise VkrtError(f"{len(masks)} token masks for {rows} tokens")
        pack_masks(rows, self.model.cfg.vocab_size, masks, out=self._mask_table().host_bytes.view(np.uint32))
        return True

    def _mask_table(self) -> Buffer:
        """The token masks' table, made on first use (read where it lies, as the adjustments: a
        few KB a row)."""
        if self._masks is None:
            words = mask_table_words(self.candidate_rows, self.model.cfg.vocab_size)
            self._masks = Buffer(self.device, 4 * words, MemoryKind.HOST, label="token masks")
        return self._masks

    def _read_candidates(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        pairs = self._top.read(np.uint32, 8 * CANDIDATES * rows).reshape(rows, CANDIDATES, 2)
        k = int((pairs[0, :, 1] != 0xFFFFFFFF).sum())   # a vocabulary smaller than CANDIDATES pads the list
        return pairs[:, :k, 0].view(np.float32), pairs[:, :k, 1].astype(np.int64)

    def greedy(self, token: int, seq_id: int = 0, n: int = 1, pipeline: bool | None = None) -> Iterator[int]:
        """Greedy decoding on the GPU: append `token` to `seq_id`, then yield the n tokens that
        follow, each picked by an argmax on the GPU (the host reads 4 bytes a step; a split model
        writes it back as the next step's input). With `pipeline` (default: unless the model
        keeps a recurrent state, which cannot be rewound) the step after a token is submitted
        before the token is yielded; when the consumer stops early, that step is waited for and
        its KV cell forgotten, so the cache holds exactly the tokens evaluated for what was
        consumed. On a split the next step's first stage needs the token the last stage's argmax
        wrote, which the host reads (separate devices share no semaphore here): its inputs are
        written while the last step ends, then the host waits for the token, writes it and runs
        the step's stages, the last one left running while the token is yielded."""
        vocab = self.model.cfg.vocab_size
        if not 0 <= token < vocab:
            raise VkrtError(f"token ids must be in [0, {vocab}); got {token}")
        if n < 1:
            return
        pipeline = not self.recurrent if pipeline is None else pipeline
        if pipeline and self.recurrent:
            raise VkrtError("a recurrent state cannot be rewound: pipelined greedy decoding needs a model without one")
        seqs = np.array([seq_id], np.int32)
        pending: list[tuple[int, int, _Graph]] = []   # (inputs copy, position, graph) of steps in flight

        def submit(first: bool) -> None:
            parity = (pending[-1][0] ^ 1) if pending else 0
            t0 = time.perf_counter()
            pos = self.cache.cells.length(seq_id)
            g, slots = self._prepare(np.array([token], np.int32), seqs, np.array([pos], np.int32), False,
                                     chain=(parity, not first and not self.split))
            if self.split and pending:   # pipelined: the step before is ending; its token is the input
                self._wait(pending[-1][2].seqs[-1])
                self._write_token(parity, self._read_token(pending[-1][0]))
            if g.prefetched or self.split:   # uploads interleaved with the layers, or stages: run in order
                self._run(g, parity, wait_last=not self.split)
            else:
                g.seqs[0].submit()
            self._advance(slots, 1)
            pending.append((parity, pos, g))
            self.stats.seconds += time.perf_counter() - t0

        def finish() -> int:
            parity, _, g = pending.pop(0)
            t1 = time.perf_counter()
            self._wait(g.seqs[-1])
            out = self._read_token(parity)
            self._count(1, time.perf_counter() - t1)
            return out

        try:
            submit(first=True)
            for i in range(n):
                if pipeline and i + 1 < n:
                    submit(first=False)
                token = finish()
                yield token
                if not pipeline and i + 1 < n:
                    submit(first=False)
        finally:
            for _, pos, g in pending:   # submitted for a token the consumer did not take
                g.seqs[-1].wait()
                self.cache.cells.free(seq_id, pos)
            pending.clear()

    def _read_token(self, parity: int) -> int:
        """The token a chain step's argmax wrote (copy `parity`)."""
        return int(self._tokens.read(np.int32, 4, 16 * parity)[0])

    def _write_token(self, parity: int, token: int) -> None:
        """Make `token` the input of the chain step whose inputs are copy `parity`, on every stage."""
        at = parity * self._inputs_size + self._layout["ids"]
        for st in self.stages:
            st.inputs.host_bytes[at:at + 4] = np.array([token], np.int32).view(np.uint8)

    def reset(self, seq_id: int | None = None, from_pos: int = 0) -> None:
        """Forget a sequence's cells from `from_pos` on (all sequences when seq_id is None). A
        recurrent state can only be kept whole or cleared: from_pos must be 0 or the sequence's
        length (restore_state first to resume from a checkpoint)."""
        cells = self.cache.cells
        if self.state is not None:
            slots = range(self.state.n_slots) if seq_id is None else [seq_id]
            for s in slots:
                self.state.check_slot(s)
            if seq_id is not None and 0 < from_pos < self.state.length[seq_id]:
                raise VkrtError(f"sequence {seq_id}: cannot keep {from_pos} of the {self.state.length[seq_id]} "
                                f"tokens of a recurrent state (restore a checkpoint at or before that position)")
            if from_pos == 0:
                self.state.clear(slots)
        if seq_id is None:
            cells.seq[:] = -1
        else:
            cells.free(seq_id, from_pos)

    def save_state(self, seq_id: int) -> Checkpoint | None:
        """Save `seq_id`'s recurrent state (at its current length) to a host checkpoint; None
        when the model has no recurrent state or every checkpoint is taken."""
        if self.state is None:
            return None
        return self.state.save(seq_id)

    def restore_state(self, seq_id: int, ckpt: Checkpoint) -> None:
        """Resume `seq_id` from a checkpoint: its state is the checkpoint's and its KV cells past
        the checkpoint's length are forgotten."""
        self.state.restore(seq_id, ckpt)
        self.cache.cells.free(seq_id, ckpt.length)

    def release_state(self, ckpt: Checkpoint) -> None:
        if self.state is not None:
            self.state.release(ckpt)

    def _release(self) -> None:
        for g in self._graphs.values():
            g.close()
        self._graphs.clear()
        for obj in (self._logits, self._tokens, self._argmax_part, self._top, self._adjust, self._hidden, self._masks,
                    *self._top_scratch, *self.handoffs, *reversed(self.stages)):
            if obj is not None:
                obj.close()
