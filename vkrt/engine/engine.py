"""Engine: feeds token batches through a model, one recorded step graph per batch shape.

Per step the host writes token ids, positions, KV cells and the attention mask into one
host-visible buffer (step_inputs.py) and submits the graph recorded for that shape (n_tokens,
KV cells to attend, what is read back: a GraphKey, step_graph.py); the graph starts by copying
those inputs to the GPU and ends by copying the logits, the greedy token or the top-k
candidates back (readback.py). Host work per step does not depend on the number of layers.
The step runner (step_runner.py) keeps the recorded graphs, submits them and counts the cost;
greedy decoding chains its steps on the GPU (greedy.py).

A model split by layers over several devices (Model.split) runs as one Stage per device
(stage.py), each with its layers' KV cache, recurrent state, activations and recorded part of
every graph; a step runs them in turn, the residual stream handed across (handoff.py). Prompts
of several micro-batches run as a pipeline over the stages (StepRunner.pipelined,
wavefront.py), and with pipeline_steps so do the groups of sequences a step of several is split
into (StepRunner.groups).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Iterator

import numpy as np

from ..errors import BufferTooLarge, ConfigError, VkrtError
from ..memory import F16, ggml_type
from ..model.delta_net_block import record_rule
from ..model.loader import Model
from ..ops.kv_quant import KV_QUANT
from ..owned import Owned
from .greedy import greedy_tokens
from .handoff import Handoff
from .host_experts import ExpertTraffic, cpu_expert_options
from .kv_cache import CellTable
from .logit_adjust import LogitAdjustments
from .readback import Readback
from .recurrent_state import Checkpoint, RecurrentState
from .stage import Stage
from .state_group import StateGroup
from .step_graph import GraphKey
from .step_inputs import KV_STEP, MULTI_SEQ_MIN_SPAN, PAD_FROM, StepInputs
from .step_runner import StepGroup, StepRunner, group_rows


class Engine(Owned):
    """Runs `model` with a KV cache of `n_ctx` cells, ubatches of at most `n_ubatch` tokens.
    Models with Gated DeltaNet layers also keep a recurrent state for each of `n_seq_max`
    sequences (ids 0..n_seq_max-1) and a pool of `n_checkpoints` saved states in host memory.
    verify_tokens: the most tokens a speculative step takes (SpecOptions.step_tokens: a server's
    slots x (--draft-max + 1)): a recurrent state keeps the DeltaNet inputs of steps that size
    (keep_columns: 16 to 64), so a partly accepted one catches up rather than replaying its
    accepted tokens. Recorded step graphs are kept for `max_graphs` shapes (default 16, and 6 a sequence more: a
    server's decode steps take every batch size up to its slots, with and without candidates,
    and its mixed steps several sizes of prompt and of output; twice that with pipeline_steps).
    pipeline_steps: on a layer split, run a step of several sequences (decode, decode_candidates,
    mixed) as groups of whole sequences pipelined over the stages (see StepRunner.groups), not
    as one pass stage after stage. cpu_experts "auto" / "all" (with cpu_moe_threads, and
    link_bandwidth GB/s pacing the expert copies): decode steps plan host-resident experts on
    the host and compute some on the CPU (host_experts.py); "off": the GPU computes them all.
    kv_type: the KV cache's type (K's, and V's unless kv_type_v is given; quantised types need
    flash_attn).
    pad_prompts False: prompt steps run unpadded (an MTP head's inputs are a row a token).
    vision: the model's image input (a model.vision.Vision, which the engine then owns and closes):
    its steps may then take input embeddings (embed(): an image's rows) as well as token ids;
    embd_input: they may without one (an MTP head reads the trunk's image rows).
    The parts it runs with: `stages`, `inputs` (StepInputs),
    `readback` (Readback) and `steps` (StepRunner: the recorded graphs, `steps.graphs`)."""

    def __init__(self, model: Model, *, n_ctx: int = 4096, n_batch: int = 2048, n_ubatch: int = 512,
                 flash_attn: bool = True, kv_type=F16, max_graphs: int | None = None, replay: bool = True,
                 prefetch_slots: int | None = None, stage_experts: bool | None = None,
                 expert_cache: int | None = None, n_seq_max: int = 1, n_checkpoints: int = 0,
                 pipeline_steps: bool = False, cpu_experts: str = "off", cpu_moe_threads: int | None = None,
                 link_bandwidth: float | None = None, pad_prompts: bool = True, kv_type_v=None, vision=None,
                 embd_input: bool = False, verify_tokens: int = 0):
        super().__init__("engine")
        self.model = model
        self.vision = vision
        self.embd_input = embd_input = embd_input or vision is not None
        self.device = dev = model.device
        cfg = model.cfg
        if n_ubatch > n_batch:
            n_ubatch = n_batch
        self.n_ctx, self.n_batch, self.n_ubatch = n_ctx, n_batch, n_ubatch
        self.n_seq_max = n_seq_max
        self.flash_attn = flash_attn
        quantised = [ggml_type(t).name for t in (kv_type, kv_type_v) if t is not None and ggml_type(t).name in KV_QUANT]
        if quantised and not flash_attn:
            raise ConfigError(f"a quantised KV cache ({quantised[0].lower()}, -ctk/-ctv) is read by flash attention "
                              f"only: turn it on (-fa on) or keep -ctk/-ctv f16")
        self.stages: list[Stage] = []
        self.handoffs: list[Handoff] = []
        self.prefetch = self.staging = self.readback = self.inputs = self.steps = None
        self.state: RecurrentState | StateGroup | None = None
        split = model.split
        devices, ranges = (split.devices, split.ranges) if split is not None else ([dev], [range(cfg.n_layer)])
        try:
            cells = CellTable(n_ctx)
            for k, (d, layers) in enumerate(zip(devices, ranges)):
                self.stages.append(Stage(model, d, layers, cells, n_ctx=n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn,
                                         kv_type=kv_type, kv_type_v=kv_type_v, n_seq_max=n_seq_max,
                                         n_checkpoints=n_checkpoints,
                                         output=k == len(devices) - 1, embd_input=embd_input,
                                         verify_tokens=verify_tokens))
            for a, b in zip(self.stages, self.stages[1:]):
                self.handoffs.append(Handoff(a.device, b.device, 4 * cfg.n_embd * n_ubatch))
            main = self.stages[-1]
            self.transformer, self.scratch, self.cache = main.transformer, main.scratch, main.cache
            states = [st.state for st in self.stages if st.state is not None]
            self.state = states[0] if len(states) == 1 else StateGroup(states) if states else None
            self.readback = Readback(dev, cfg.vocab_size, cfg.n_embd, n_ubatch)
            self.candidate_rows = self.readback.candidate_rows   # the most tokens decode_candidates takes
            cpu = cpu_expert_options(dev, model, cpu_experts, cpu_moe_threads, link_bandwidth)
            encoder = vision.activation_bytes if vision is not None else 0   # what an image's encoding takes
            for st in self.stages:
                st.add_experts(n_ubatch, stage_experts, expert_cache, prefetch_slots, cpu,
                               reserve=encoder if st.device is dev else 0)
            self.staging, self.prefetch = main.staging, main.prefetch
            pads = pad_prompts and flash_attn and not self.recurrent and not self.host_experts   # without side effects
            self.inputs = StepInputs(self.stages, cells, self.state, cfg, n_ctx=n_ctx, n_ubatch=n_ubatch,
                                     flash_attn=flash_attn, pads=pads,
                                     min_span=MULTI_SEQ_MIN_SPAN if n_seq_max > 1 else KV_STEP)
            # pipelined steps record each group's shape for both copies of the inputs (parity)
            max_graphs = max_graphs if max_graphs is not None else \
                (16 + 6 * max(0, n_seq_max - 1)) * (2 if pipeline_steps else 1)
            self.steps = StepRunner(self.stages, self.handoffs, self.inputs, self.readback, flash_attn=flash_attn,
                                    max_graphs=max_graphs, replay=replay, pipeline_steps=pipeline_steps,
                                    moe=cfg.n_expert > 0)
        except BufferTooLarge as exc:
            self.close()
            raise ConfigError(f"{exc}: activations, logits and the attention mask grow with the micro-batch and the "
                              f"context; lower -ub (now {n_ubatch}) or -c (now {n_ctx})") from None
        except BaseException:
            self.close()
            raise
        self.stats = self.steps.stats

    @property
    def split(self) -> bool:
        """Whether the model runs on several devices (a layer split: one stage each)."""
        return len(self.stages) > 1

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV cache on every device."""
        return sum(st.cache.nbytes for st in self.stages)

    def expert_traffic(self) -> ExpertTraffic | None:
        """Where the decode steps' (token, expert) pairs ran and the expert bytes that crossed the
        link, over every stage (None: the host does not plan the experts, --cpu-experts off)."""
        hosts = [st.host_experts for st in self.stages if st.host_experts is not None]
        if not hosts:
            return None
        total = ExpertTraffic()
        for h in hosts:   # the stages of a split count their own layers' pairs, each the same tokens
            for f in dataclasses.fields(total):
                mine = getattr(h.traffic, f.name)
                setattr(total, f.name, max(total.tokens, mine) if f.name == "tokens" else getattr(total, f.name) + mine)
        return total

    def expert_cache_hit_rate(self) -> float | None:
        """Share of the experts decode steps chose that were already cached, over every stage
        (None: no expert cache)."""
        traffic = self.expert_traffic()
        if traffic is not None and any(st.staging.cache_slots for st in self.stages):
            pairs = traffic.pairs_cached + traffic.pairs_copied + traffic.pairs_cpu
            return traffic.pairs_cached / pairs if pairs else 0.0
        counts = [c for st in self.stages if st.staging is not None and (c := st.staging.hit_counts()) is not None]
        if not counts:
            return None
        hits, misses = sum(h for h, _ in counts), sum(m for _, m in counts)
        return hits / (hits + misses) if hits + misses else 0.0

    @property
    def recurrent(self) -> bool:
        """Whether the model keeps a recurrent state (it cannot be rewound: see save_state)."""
        return self.state is not None

    @property
    def host_experts(self) -> bool:
        """Whether MoE layers read their experts from host memory: a prompt step then streams them
        over the bus (or reads them in place), a cost that hardly depends on its size."""
        return any(st.prefetch.layers or st.staging.layers for st in self.stages)

    @property
    def pads_prompts(self) -> bool:
        """Whether prompt steps run padded (PAD_FROM): flash attention, no recurrent state, no
        host experts."""
        return self.inputs.pads

    def padded_tokens(self, n: int) -> int:
        """The tokens a prompt step of n runs as: n, or with padding a multiple of PAD_STEP up to
        the micro-batch."""
        return self.inputs.padded_tokens(n)

    def kv_span(self, used: int) -> int:
        """The KV cells a step attends over when `used` are in use (one past the highest): with
        flash attention a power of two (at least MULTI_SEQ_MIN_SPAN in an engine for several
        sequences), else a multiple of KV_STEP; never more than the context."""
        return self.inputs.kv_span(used)

    @staticmethod
    def out_rows(n: int, cap: int) -> int:
        """The logits rows a step of n parts computes: n rounded up to a power of two up to
        PAD_FROM, past it to a multiple of PAD_FROM (so a server's steps reuse a few graphs),
        at most cap."""
        rows = 1 << (n - 1).bit_length() if n <= PAD_FROM else -(-n // PAD_FROM) * PAD_FROM
        return max(n, min(rows, cap))

    def sequence_length(self, seq_id: int) -> int:
        """Tokens of `seq_id` held in the KV cache."""
        return self.cache.cells.length(seq_id)

    # -- evaluation --------------------------------------------------------------------------------
    def eval(self, tokens, seq_id: int = 0, all_logits: bool = False) -> np.ndarray:
        """Append `tokens` to sequence `seq_id`; returns the logits of its last token
        ([vocab]) or of every token ([n, vocab]) with all_logits."""
        tokens = np.asarray(tokens, dtype=np.int32)
        if tokens.size == 0:
            raise VkrtError("eval needs at least one token")
        self.inputs.check_tokens(tokens)
        start = self.cache.cells.length(seq_id)
        if self.split and tokens.size > self.n_ubatch:
            steps = [(tokens[u0:u0 + self.n_ubatch], np.full(min(self.n_ubatch, tokens.size - u0), seq_id, np.int32),
                      np.arange(u0, min(u0 + self.n_ubatch, tokens.size), dtype=np.int32) + start)
                     for u0 in range(0, tokens.size, self.n_ubatch)]
            outs = self.steps.pipelined(steps, all_logits)
            return np.concatenate(outs) if all_logits else outs[-1][-1]
        outs = []
        for b0 in range(0, tokens.size, self.n_batch):
            batch = tokens[b0:b0 + self.n_batch]
            for u0 in range(0, batch.size, self.n_ubatch):
                ub = batch[u0:u0 + self.n_ubatch]
                last = b0 + u0 + ub.size == tokens.size
                out = self._step(ub, np.full(ub.size, seq_id, np.int32),
                                 np.arange(ub.size, dtype=np.int32) + start + b0 + u0, all_logits)
                if all_logits or last:
                    outs.append(out)
        return np.concatenate(outs) if all_logits else outs[-1][-1]

    def _step(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray, all_logits: bool) -> np.ndarray:
        """One prompt step of one sequence: its logits, every row or the last."""
        t0 = time.perf_counter()
        n = ids.size
        pad, (ids, seqs, pos) = self.inputs.padded(ids, seqs, pos)
        self.steps.step(ids, seqs, pos, all_logits=all_logits)
        logits = self.readback.logits(ids.size if all_logits else 1)
        self.stats.add_step(n, time.perf_counter() - t0)
        return logits[pad:] if all_logits else logits

    def embed(self, rows: np.ndarray, rope: np.ndarray, after: np.ndarray, seq_id: int = 0,
              causal: bool = True, ids=None) -> np.ndarray:
        """Append input embeddings `rows` ([n, n_embd] float32: an image's, which stand where
        token embeddings would) to sequence `seq_id`, at rotary positions `rope` ([n, 3]: t, y,
        x) with `after` ([n]: the rotary position of a text token after each; CellTable), in
        steps of their own (micro-batches); returns the logits after the last row ([vocab]).
        causal False: the rows of a step attend each other both ways (Gemma 3's images, as
        llama.cpp decodes them with causal attention off: a row sees the later rows of its own
        micro-batch only). ids: what the rows stand as (an image's placeholders), handed to
        keep_hidden's sink with their states and rows."""
        rows = np.asarray(rows, np.float32)
        n, E = rows.shape[0], self.model.cfg.n_embd
        rope, after = np.asarray(rope, np.int32).reshape(-1, 3), np.asarray(after, np.int32).reshape(-1)
        if not self.embd_input:
            raise VkrtError("this engine takes no input embeddings: open it with a vision encoder (--mmproj)")
        if rows.ndim != 2 or rows.shape[1] != E or n == 0 or rope.shape[0] != n or after.size != n:
            raise VkrtError(f"embed takes rows [n, {E}] with rope [n, 3] and after [n], n >= 1; got "
                            f"{list(rows.shape)}, {list(rope.shape)}, {list(after.shape)}")
        ids = np.zeros(n, np.int32) if ids is None else np.asarray(ids, np.int32).reshape(-1)
        if ids.size != n:
            raise VkrtError(f"embed: {ids.size} ids for {n} rows")
        start = self.cache.cells.length(seq_id)
        logits = None
        for u0 in range(0, n, self.n_ubatch):
            t0 = time.perf_counter()
            m = min(self.n_ubatch, n - u0)
            pad, (step_ids, seqs, pos) = self.inputs.padded(ids[u0:u0 + m], np.full(m, seq_id, np.int32),
                                                            np.arange(m, dtype=np.int32) + start + u0)
            lead = lambda a: np.concatenate([np.zeros((pad,) + a.shape[1:], a.dtype), a])   # noqa: E731
            self.steps.step(step_ids, seqs, pos, rows=lead(rows[u0:u0 + m]),
                            rope=(lead(rope[u0:u0 + m]), lead(after[u0:u0 + m])), causal=causal)
            logits = self.readback.logits(1)
            self.stats.add_step(m, time.perf_counter() - t0)
        return logits[-1]

    def hidden_states(self, tokens, seq_id: int = 0) -> np.ndarray:
        """Append `tokens` to sequence `seq_id`; returns every token's final hidden state after
        the output norm, [n, n_embd] (what llama.cpp returns as a decoder model's embeddings:
        the input of the output matrix, which these steps do not run)."""
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if tokens.size == 0:
            raise VkrtError("hidden_states needs at least one token")
        self.inputs.check_tokens(tokens)
        self.readback.open_hidden()
        start = self.cache.cells.length(seq_id)
        rows = []
        for u0 in range(0, tokens.size, self.n_ubatch):
            t0 = time.perf_counter()
            ub = tokens[u0:u0 + self.n_ubatch]
            pad, (ids, seqs, pos) = self.inputs.padded(ub, np.full(ub.size, seq_id, np.int32),
                                                       np.arange(ub.size, dtype=np.int32) + start + u0)
            self.steps.step(ids, seqs, pos, hidden=True)
            rows.append(self.readback.hidden(ids.size)[pad:])
            self.stats.add_step(ub.size, time.perf_counter() - t0)
        return np.concatenate(rows)

    def decode(self, batch: list[tuple[int, int]]) -> np.ndarray:
        """One step for several sequences at once (continuous batching): batch holds
        (seq_id, token) pairs; returns each token's next-token logits, [len(batch), vocab]."""
        if not batch:
            raise VkrtError("decode needs at least one (sequence, token) pair")
        if len(batch) > self.n_ubatch:
            raise VkrtError(f"decode of {len(batch)} sequences exceeds the micro-batch of {self.n_ubatch}")
        seqs, ids, pos = self.inputs.decode_batch(batch)
        t0 = time.perf_counter()

        def group(r: range) -> StepGroup:
            n = len(r)
            return StepGroup(ids[r.start:r.stop], seqs[r.start:r.stop], pos[r.start:r.stop], n,
                             dict(all_logits=True), lambda: self.readback.logits(n))

        outs = self.steps.run_groups([group(r) for r in self.steps.groups([1] * len(batch))])
        self.stats.add_step(len(batch), time.perf_counter() - t0)
        return np.concatenate(outs)

    def record_prompt_step(self, n_tokens: int) -> None:
        """Record, not run, the graph of a step of n_tokens prompt tokens of one sequence over
        an empty cache that reads back its last token's candidates (as mixed with top): the
        pipelines such a step takes are created without its run (with host experts, a stream of
        every expert)."""
        longest = min(self.n_ubatch, self.n_ctx)
        if not 0 < n_tokens <= longest:
            raise VkrtError(f"a prompt step takes 1 to {longest} tokens, got {n_tokens}")
        n = self.padded_tokens(n_tokens)
        self.steps.graph(GraphKey(n, self.kv_span(n), top=True, out_rows=self.out_rows(1, self.candidate_rows)))

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
        self.readback.check_tables(adjustments, masks, len(batch), "decode_candidates")
        seqs, ids, pos = self.inputs.decode_batch(batch)
        t0 = time.perf_counter()

        def group(r: range) -> StepGroup:
            n = len(r)
            adj, msk = group_rows(adjustments, r, n), group_rows(masks, r, n)
            adjust, masked = adj is not None, msk is not None
            return StepGroup(ids[r.start:r.stop], seqs[r.start:r.stop], pos[r.start:r.stop], n,
                             dict(all_logits=True, top=True, adjust=adjust, masked=masked),
                             lambda: self.readback.candidates(n), lambda: self.readback.write_tables(adj, msk, n))

        outs = self.steps.run_groups([group(r) for r in self.steps.groups([1] * len(batch))])
        self.stats.add_step(len(batch), time.perf_counter() - t0)
        return np.concatenate([v for v, _ in outs]), np.concatenate([i for _, i in outs])

    def mixed(self, parts: list[tuple[int, object]], adjustments: list[LogitAdjustments | None] | None = None,
              top: bool = False, masks: list[np.ndarray | None] | None = None, rows: list[int] | None = None):
        """One step over several sequences' tokens together (a server's decode tokens and prompt
        chunks in one micro-batch): part (seq_id, tokens) appends tokens to seq_id. Returns the
        next-token logits after each part's last token, [len(parts), vocab]; with `top` each
        part's CANDIDATES best (values, ids) instead, as decode_candidates (at most candidate_rows
        parts; adjustments and masks per part). A model with a recurrent state takes parts of one size
        (its DeltaNet layers read a step as equal runs of tokens, a sequence each): one token a part
        (decode), or several prompts' chunks of one length read together.
        rows: per part, how many of its last tokens' outputs to return (default 1: the last; a
        speculative verification reads every token of its part); the outputs, and the
        adjustments and masks, are then one a row, part after part."""
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
        outs_per = np.ones(len(parts), np.int64) if rows is None else np.asarray(rows, np.int64)
        if outs_per.shape != sizes.shape or (outs_per < 1).any() or (outs_per > sizes).any():
            raise VkrtError(f"rows: 1 to a part's size for each part; got {list(outs_per)} for sizes {sizes.tolist()}")
        n_out = int(outs_per.sum())
        if top and n_out > self.candidate_rows:
            raise VkrtError(f"candidates are read for at most {self.candidate_rows} rows a step, got {n_out}")
        if top:
            self.readback.check_tables(adjustments, masks, n_out, "mixed")
        self.inputs.check_tokens(np.concatenate(toks))
        t0 = time.perf_counter()
        pos = [np.arange(t.size, dtype=np.int32) + self.cache.cells.length(s) for s, t in zip(seq_ids, toks)]
        cap = self.candidate_rows if top else self.n_ubatch   # the most output rows

        first_out = np.concatenate([[0], np.cumsum(outs_per)])   # each part's first output row

        def group(r: range) -> StepGroup:
            ids, seqs = np.concatenate(toks[r.start:r.stop]), np.repeat(np.array(seq_ids[r.start:r.stop], np.int32),
                                                                         sizes[r.start:r.stop])
            pad, (ids, seqs, p) = self.inputs.padded(ids, seqs, np.concatenate(pos[r.start:r.stop]))
            ends = np.cumsum(sizes[r.start:r.stop]) + pad
            out = np.concatenate([np.arange(e - m, e) for e, m in zip(ends, outs_per[r.start:r.stop])])
            k = out.size
            n_rows = self.out_rows(k, cap)
            out = np.concatenate([out, np.full(n_rows - k, out[-1])])   # the extra rows repeat the last
            span = range(int(first_out[r.start]), int(first_out[r.stop]))
            adj, msk = (group_rows(adjustments, span, n_rows), group_rows(masks, span, n_rows)) if top else (None, None)
            adjust, masked = adj is not None, msk is not None

            def read():
                if top:
                    values, cand = self.readback.candidates(n_rows)
                    return values[:k], cand[:k]
                return self.readback.logits(n_rows)[:k]
            return StepGroup(ids, seqs, p, len(r) if self.recurrent else 1,
                             dict(all_logits=False, top=top, adjust=adjust, out=out, masked=masked), read,
                             lambda: self.readback.write_tables(adj, msk, n_rows))

        ranges = self.steps.groups(sizes.tolist(), pads=True, rows=lambda k: self.out_rows(k, cap)) \
            if n_out == len(parts) else [range(len(parts))]   # several rows of a part: one group
        outs = self.steps.run_groups([group(r) for r in ranges])
        self.stats.add_step(n, time.perf_counter() - t0)
        if top:
            return np.concatenate([v for v, _ in outs]), np.concatenate([i for _, i in outs])
        return np.concatenate(outs)

    def verify(self, tokens, seq_id: int = 0, top: bool = False,
               adjustments: list[LogitAdjustments | None] | None = None, masks: list[np.ndarray | None] | None = None):
        """A speculative step: append `tokens` (a sampled token and the drafts after it) to
        `seq_id` in one step and return the next-token outputs after each of them: logits
        [n, vocab], or with `top` each row's candidates (values, ids) as decode_candidates (at
        most candidate_rows tokens; adjustments and masks a token). Rejected drafts are then
        taken back with truncate()."""
        tokens = np.asarray(tokens, np.int32).reshape(-1)
        return self.mixed([(seq_id, tokens)], adjustments, top=top, masks=masks, rows=[tokens.size])

    @property
    def verify_tokens(self) -> int:
        """The most tokens a verification step should hold: the micro-batch; with host-resident
        experts the most a step runs through the decode path (the chosen experts staged or
        cached once for all its tokens, or run on the CPU: tuning.mv_max_n), not a prompt
        step's stream of every expert or reads in place."""
        if not self.host_experts:
            return self.n_ubatch
        return min(self.n_ubatch, min(st.device.tuning.mv_max_n for st in self.stages))

    def snapshot(self, seq_id: int) -> int:
        """Mark `seq_id`'s current length as a point truncate() can return to: a recurrent state
        is copied to a snapshot in VRAM (a KV cache needs nothing). Returns the length."""
        if self.state is not None:
            self.state.snapshot(seq_id)
        return self.sequence_length(seq_id)

    def can_truncate(self, seq_id: int, length: int) -> bool:
        """Whether truncate(seq_id, length) can keep the sequence's first `length` tokens, or
        those up to its recurrent-state snapshot."""
        return self.state is None or self.state.length[seq_id] <= length or \
            0 <= self.state.snapshot_length[seq_id] <= length

    def truncate(self, seq_id: int, length: int) -> int:
        """Forget `seq_id`'s tokens past `length`. A recurrent state cannot be cut: it goes back
        to its snapshot (taken at or before `length`); where the last step started there and
        kept its DeltaNet inputs (a step of at most KEEP_COLUMNS tokens) the delta rule runs
        again over the tokens up to `length` (RecurrentState.catch_up), else the tokens between
        the snapshot and `length` must be fed again. Returns the length the sequence now holds."""
        if self.state is None or self.state.length[seq_id] <= length:
            self.cache.cells.free(seq_id, length)
            return self.sequence_length(seq_id)
        snap = int(self.state.snapshot_length[seq_id])
        if not 0 <= snap <= length:
            raise VkrtError(f"sequence {seq_id}: no recurrent-state snapshot at or before position {length} "
                            f"(snapshot() before a step that may be taken back)")
        if self.state.catch_up_span(seq_id, length) is not None:
            for st in self.stages:
                if st.state is not None:
                    st.state.catch_up(seq_id, length, functools.partial(record_rule, st.transformer))
            self.cache.cells.free(seq_id, length)
            return length
        self.state.rewind(seq_id)
        self.cache.cells.free(seq_id, snap)
        return snap

    def greedy(self, token: int, seq_id: int = 0, n: int = 1, pipeline: bool | None = None) -> Iterator[int]:
        """Greedy decoding on the GPU (greedy.py): append `token` to `seq_id`, then yield the n
        tokens that follow, each picked by an argmax on the GPU (the host reads 4 bytes a step).
        With `pipeline` (default: unless the model keeps a recurrent state, which cannot be
        rewound) the step after a token is submitted before the token is yielded; when the
        consumer stops early, that step is waited for and its KV cell forgotten."""
        self.inputs.check_tokens(np.array([token]))
        if n < 1:
            return
        pipeline = not self.recurrent if pipeline is None else pipeline
        if pipeline and self.recurrent:
            raise VkrtError("a recurrent state cannot be rewound: pipelined greedy decoding needs a model without one")
        yield from greedy_tokens(self.steps, token, seq_id, n, pipeline)

    def keep_hidden(self, sink) -> None:
        """From now on every step run through StepRunner.step also hands sink(seqs, pos, ids, states)
        each token's normed final state (an MTP head drafts from them), a step of embed() its
        input rows as well (sink(seqs, pos, ids, states, rows)); None: no more."""
        if sink is not None:
            if self.split:
                raise ConfigError("the final states of a model split over several devices are not kept")
            self.readback.open_hidden()
        self.steps.hidden_sink = sink

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
        for obj in (self.steps, self.readback, *self.handoffs, *reversed(self.stages), self.vision):
            if obj is not None:
                obj.close()
