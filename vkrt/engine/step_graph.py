"""Step graphs: the recorded forward pass of one step shape, and the key that selects it.

A step's host work is writing its inputs (step_inputs.py) and submitting the graph recorded for
its GraphKey: everything that changes between steps of one key is an input the graph's first
commands copy to the GPU, so a key is recorded once and replayed (step_runner.py keeps them).
A graph holds one StageGraph a stage (a layer split runs them in order, the residual stream
handed across); it ends as its key says (readback.py): logits rows, a greedy argmax, top-k
candidates or hidden states (or the logits and hidden states).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..model.transformer import RecordOptions
from .stage import StageGraph


@dataclass(frozen=True)
class GraphKey:
    """Everything that selects a recorded step graph."""

    n_tokens: int              # tokens the step runs (padding included)
    n_kv: int                  # KV cells attention spans (StepInputs.kv_span)
    n_seqs: int = 1            # equal runs of tokens the DeltaNet layers read as sequences (1 without them)
    all_logits: bool = False   # the logits of every token, else of the last (or with out_rows of out_ids')
    out_rows: int = 0          # > 0: the logits of the out_rows tokens the out_ids input names
    top: bool = False          # the CANDIDATES best logits of each row instead of the rows
    adjust: bool = False       # top: after applying the logit adjustments table the host wrote
    masked: bool = False       # top: then the token masks the host wrote (grammars)
    hidden: bool = False       # every token's normed final state instead of any logits
    keep_hidden: bool = False  # every token's normed final state as well as the logits (an MTP head's input)
    chain: bool = False        # greedy: the argmax of the last token's logits instead of them
    ids_on_gpu: bool = False   # chain: its token is the last chain step's argmax, not written by the host
    parity: int = 0            # the copy of the step inputs (and of a split's handoffs) it reads
    fa_plan: int = 0           # > 0: flash attention splits the KV cells as a step of this many tokens would
    embd: bool = False         # the tokens are input embeddings the host wrote (an image's rows), not ids


@dataclass
class StepGraph:
    """The recorded forward pass of one key: each stage's part of it, and the options it was
    recorded with."""

    stages: list[StageGraph]
    opts: RecordOptions

    @property
    def seqs(self) -> list:
        return [seq for g in self.stages for seq in g.seqs]

    @property
    def hosted(self) -> bool:
        """Whether the host works between its segments (host-planned experts)."""
        return any(g.hosts for g in self.stages)

    @property
    def prefetched(self) -> list[int]:
        return [il for g in self.stages for il in g.prefetched]

    def close(self) -> None:
        for g in self.stages:
            g.close()


def record_graph(key: GraphKey, stages: list, handoffs: list, readback, flash_attn: bool) -> StepGraph:
    """Record the step graph of `key` over `stages` (each its own part; on a split, stage k
    receives the residual stream from handoffs[k - 1] and sends it on through handoffs[k]),
    ending in `readback`'s buffers."""
    cfg, scratch = stages[-1].model.cfg, stages[-1].scratch
    if key.top:
        def read(seq, n, row):
            readback.record_candidates(seq, scratch.logits, n, row, key.adjust, key.masked)
    elif key.chain:
        def read(seq, n, row):
            readback.record_argmax(seq, scratch.logits, scratch.ids, key.parity)
    else:
        def read(seq, n, row):
            readback.record_rows(seq, scratch.logits, n, row)
    opts = RecordOptions(key.n_tokens, key.n_kv, key.all_logits, flash_attn, key.n_seqs,
                         read_logits=None if key.hidden else read, out_rows=key.out_rows,
                         read_hidden=readback.record_hidden if key.hidden else None, fa_plan_tokens=key.fa_plan,
                         keep_hidden=readback.record_hidden if key.keep_hidden else None, embd=key.embd)
    n, n_kv = key.n_tokens, key.n_kv
    sizes = {"ids": 4 * n, "pos": 4 * n * cfg.pos_streams, "cells": 4 * n, "slots": 4 * key.n_seqs,
             "mask": 2 * n_kv * n, "mask_swa": 2 * n_kv * n, "kv_used": 4, "mask_zero": 4,
             "mask_swa_zero": 4, "out_ids": 4 * key.out_rows,
             "embd": 4 * cfg.n_embd * n if key.embd else 0}
    x_bytes, parity, split = 4 * cfg.n_embd * n, key.parity, len(stages) > 1
    parts: list[StageGraph] = []
    try:
        for k, st in enumerate(stages):
            st_opts = opts
            if split:   # the residual stream arrives from the stage before and leaves for the next
                st_opts = dataclasses.replace(
                    opts, layers=st.layers,
                    receive=(lambda seq, x, h=handoffs[k - 1]: seq.copy(h.receive(parity, x_bytes), x.range(),
                                                                        x_bytes)) if k else None,
                    send=(lambda seq, x, h=handoffs[k]: seq.copy(x.range(), h.send(parity, x_bytes),
                                                                 x_bytes)) if k < len(handoffs) else None)
            use_prefetch = st.prefetch.active and n * cfg.n_expert_used >= 2 * cfg.n_expert
            use_staging = not use_prefetch and n <= st.device.tuning.mv_max_n
            staged = None
            if st.host_experts is not None and st.host_experts.takes_prompt(n, st.prefetch.active):
                use_prefetch, staged = False, st.host_experts.tensors()   # the host's plan: rates and n decide
            elif use_staging:
                staged = st.staging.tensors()
            stage_parts = st.transformer.parts(st.scratch, st.cache, st_opts,
                                               st.prefetch.experts() if use_prefetch else None, staged, state=st.state)
            label = f"forward T={n} kv={n_kv}" + (f" on {st.device.label}" if split else "")
            parts.append(st.record(stage_parts, sizes, parity, key.ids_on_gpu, label, n))
    except BaseException:
        for part in parts:
            part.close()
        raise
    return StepGraph(parts, opts)
