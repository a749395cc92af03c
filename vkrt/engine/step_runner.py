"""Step runner: records a step graph once per GraphKey and replays it (a bounded LRU of them),
submits it stage by stage (expert uploads interleaved with the layers that read them), and runs
a step of several groups, or a prompt's micro-batches, as a wavefront over a layer split's
stages (wavefront.py). It counts what the steps cost (StepStats)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from ..owned import Owned
from .step_graph import GraphKey, StepGraph, record_graph
from .step_inputs import StepInputs
from .wavefront import WaveStep, balanced_groups, run_wavefront, same_kernels

log = logging.getLogger("vkrt")


@dataclass
class StepStats:
    """What an engine's steps cost: tokens and steps run, host seconds (GPU waits apart), graphs
    recorded and the time that took, layers whose experts were prefetched."""

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

    def add_step(self, tokens: int, seconds: float) -> None:
        """One step of `tokens` tokens that kept the host `seconds` (GPU waits included)."""
        self.tokens += tokens
        self.steps += 1
        self.seconds += seconds


@dataclass
class StepGroup:
    """Sequences of a step run as one (the whole step, or a group of its parts pipelined over a
    split's stages): their tokens, the GraphKey fields of what the step reads (and its `out`
    rows: StepRunner.prepare's keywords), what reads the group's outputs after it ran and what
    writes the tables its last stage reads (logit adjustments, token masks)."""

    ids: np.ndarray
    seqs: np.ndarray
    pos: np.ndarray
    n_seqs: int
    keywords: dict
    read: Callable[[], object]
    tables: Callable[[], None] = lambda: None


def group_rows(values: list | None, r: range, rows: int) -> list | None:
    """values[r] (per part: adjustments or masks) padded with None to `rows` rows; None where
    no part in r has one."""
    if values is None or all(v is None for v in values[r.start:r.stop]):
        return None
    return list(values[r.start:r.stop]) + [None] * (rows - len(r))


class StepRunner(Owned):
    """Runs the steps of an engine's `stages` (on a split, `handoffs` between them): writes
    their inputs (`inputs`), records graphs ending in `readback`'s buffers and keeps those of
    `max_graphs` keys, least recently used evicted first (replay False: records every step
    afresh, to compare against replaying). pipeline_steps: on a split, a step of several parts
    may run as groups pipelined over the stages (groups). `moe`: the model has experts."""

    def __init__(self, stages: list, handoffs: list, inputs: StepInputs, readback, *, flash_attn: bool,
                 max_graphs: int, replay: bool, pipeline_steps: bool, moe: bool):
        super().__init__("step runner")
        self.stages, self.handoffs, self.inputs, self.readback = stages, handoffs, inputs, readback
        self.flash_attn, self.max_graphs, self.replay = flash_attn, max_graphs, replay
        self.pipeline_steps, self.moe = pipeline_steps, moe
        self._graphs: dict[GraphKey, StepGraph] = {}
        self.stats = StepStats()
        # hidden_sink(seqs, pos, ids, states[, rows]): every step run by step() also hands the host
        # each token's normed final state (an MTP head drafts from them), and a step of input
        # embeddings its rows (an image's); None: steps do not keep them
        self.hidden_sink: Callable | None = None

    @property
    def graphs(self) -> Mapping[GraphKey, StepGraph]:
        """The recorded graphs by key, least recently used first (read-only)."""
        return MappingProxyType(self._graphs)

    @property
    def split(self) -> bool:
        return len(self.stages) > 1

    def graph(self, key: GraphKey) -> StepGraph:
        """The graph of `key`: replayed, or recorded now."""
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
        g = self._graphs[key] = record_graph(key, self.stages, self.handoffs, self.readback, self.flash_attn)
        self.stats.graphs_recorded += 1
        seconds = time.perf_counter() - t0
        self.stats.record_seconds += seconds
        log.debug("recorded the step graph of %d token(s) over %d cells (logits %s, %d sequence(s)%s%s) in %.0f ms",
                  key.n_tokens, key.n_kv,
                  f"of {key.out_rows}" if key.out_rows else "all" if key.all_logits else "last", key.n_seqs,
                  ", chained" if key.chain else "", ", candidates" if key.top else "", seconds * 1e3)
        return g

    def prepare(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray, *, n_seqs: int = 1, parity: int = 0,
                out: np.ndarray | None = None, broadcast: bool = True, taken: tuple | None = None,
                fa_plan: int = 0, rows: np.ndarray | None = None, rope: tuple | None = None, causal: bool = True,
                **output) -> tuple[StepGraph, np.ndarray]:
        """Check the step, take its KV cells, write its inputs (copy `parity`) and find its
        graph; returns (graph, the sequence of each group of tokens). out: the tokens whose
        logits the step computes (default: the last, or all with all_logits). broadcast: write
        the inputs of every stage of a split (else the first's only: a pipelined step writes
        the others' when they take it up). taken: (cells, slots) from StepInputs.take_cells
        (the step's cells taken already). rows: the tokens' input embeddings [n, n_embd] (an
        image's), read instead of their ids, and rope their rotary positions (StepInputs.take_cells);
        causal False: the step's tokens attend each other both ways (StepInputs.write).
        fa_plan and `output` (what the step reads): GraphKey's."""
        if self.inputs.state is not None:   # (a step that fails before advance() leaves none kept)
            self.inputs.state.drop_kept()
        cells, slots = taken or self.inputs.take_cells(ids, seqs, pos, n_seqs, rope)
        n_kv = self.inputs.write(ids, seqs, pos, cells, slots, n_seqs, parity, out, broadcast, rows, causal)
        if rows is not None:
            output["embd"] = True
        if self.hidden_sink is not None and not output.get("hidden"):
            output["keep_hidden"] = True
        key = GraphKey(ids.size, n_kv, n_seqs if self.inputs.state is not None else 1,   # only DeltaNet layers
                       out_rows=0 if out is None else out.size, parity=parity,         # care how tokens group
                       fa_plan=0 if fa_plan == ids.size else fa_plan, **output)
        return self.graph(key), slots

    def step(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray, n_seqs: int = 1, **output) -> None:
        """Run one step (prepare's keywords) and wait for it."""
        g, slots = self.prepare(ids, seqs, pos, n_seqs=n_seqs, **output)
        self.run(g)
        self.inputs.advance(slots, ids.size // n_seqs)
        if g.opts.keep_hidden is not None:
            rows = output.get("rows")
            self.hidden_sink(seqs, pos, ids, self.readback.hidden(ids.size), *(() if rows is None else (rows,)))

    def run(self, g: StepGraph, parity: int = 0, wait_last: bool = True) -> None:
        """Submit a graph and wait for it (wait_last False: for all but its last stage): stage by
        stage, each after the last one finished and its activations were handed across (copy
        `parity` of the handoffs)."""
        for k, (st, part) in enumerate(zip(self.stages, g.stages)):
            self.stats.layers_prefetched += st.submit(part)
            if wait_last or k + 1 < len(self.stages):
                self.wait(part.seqs[-1])
            if k < len(self.handoffs):
                self.handoffs[k].carry(parity, 4 * st.model.cfg.n_embd * g.opts.n_tokens)

    def wait(self, seq) -> None:
        """Wait for a submitted sequence, counting the time as the GPU's."""
        t0 = time.perf_counter()
        seq.wait()
        self.stats.gpu_wait_seconds += time.perf_counter() - t0

    def groups(self, sizes: list[int], pads: bool = False, rows: Callable[[int], int] | None = None) -> list[range]:
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
        padded_tokens = self.inputs.padded_tokens
        if pads and padded_tokens(n) != n:
            return whole
        for r in groups:
            m = sum(sizes[r.start:r.stop])
            if not same_kernels(tunings, self.moe, n, m) or pads and padded_tokens(m) != m:
                return whole
            if rows is not None and not same_kernels(tunings, False, rows(len(sizes)), rows(len(r))):
                return whole
        return groups

    def run_groups(self, groups: list[StepGroup]) -> list:
        """Run one step as `groups`: one group as a step; several as a wavefront through the
        stages (wavefront.py), group g on stage k while group g + 1 runs on stage k - 1. The
        KV cells are taken first, those the whole step would take: each group attends over the
        span, and its keys lie in the cells, of the whole step, and flash attention splits them
        as the whole step's would.
        Returns each group's outputs."""
        if len(groups) == 1:
            gr = groups[0]
            gr.tables()
            self.step(gr.ids, gr.seqs, gr.pos, gr.n_seqs, **gr.keywords)
            return [gr.read()]
        # the whole step's cells, taken as one step takes them (a sequence's cell decides where its
        # keys sit in the cache, so the order attention sums them in)
        cells, _ = self.inputs.take_cells(*(np.concatenate([getattr(gr, f) for gr in groups])
                                            for f in ("ids", "seqs", "pos")), sum(gr.n_seqs for gr in groups))
        ends = np.cumsum([0] + [gr.ids.size for gr in groups])
        taken = [(cells[a:b], gr.seqs[::gr.ids.size // gr.n_seqs]) for gr, a, b in zip(groups, ends, ends[1:])]
        outs: list = [None] * len(groups)

        def prepare(u: int) -> WaveStep:
            gr = groups[u]
            g, _ = self.prepare(gr.ids, gr.seqs, gr.pos, n_seqs=gr.n_seqs, parity=u % 2, broadcast=False,
                                taken=taken[u], fa_plan=int(ends[-1]), **gr.keywords)
            return WaveStep(g, self.inputs.first_stage_copy(u % 2), u % 2, lambda: outs.__setitem__(u, gr.read()),
                            gr.tables)

        self.stats.layers_prefetched += run_wavefront(self.stages, self.handoffs, len(groups), prepare, self.wait)
        for gr, (_, slots) in zip(groups, taken):
            self.inputs.advance(slots, gr.ids.size // gr.n_seqs)
        return outs

    def pipelined(self, steps: list[tuple], all_logits: bool) -> list[np.ndarray]:
        """Micro-batches `steps` ((ids, seqs, pos) of one sequence each) through the stages of a
        split as a wavefront (wavefront.py), each taking its KV cells as it enters the first
        stage, as on one device. Returns each micro-batch's logits: every row, or the last."""
        outs: list = [None] * len(steps)
        counted = [time.perf_counter()]

        def prepare(u: int) -> WaveStep:
            ids, seqs, pos = steps[u]
            pad, (ids, seqs, pos) = self.inputs.padded(ids, seqs, pos)
            g, slots = self.prepare(ids, seqs, pos, all_logits=all_logits, parity=u % 2, broadcast=False)
            self.inputs.advance(slots, ids.size)

            def finish() -> None:
                outs[u] = self.readback.logits(ids.size if all_logits else 1)[pad if all_logits else 0:]
                now = time.perf_counter()
                self.stats.add_step(ids.size - pad, now - counted[0])
                counted[0] = now
            return WaveStep(g, self.inputs.first_stage_copy(u % 2), u % 2, finish)

        self.stats.layers_prefetched += run_wavefront(self.stages, self.handoffs, len(steps), prepare, self.wait)
        return outs

    def _release(self) -> None:
        for g in self._graphs.values():
            g.close()
        self._graphs.clear()
