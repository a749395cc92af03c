"""Greedy decoding on the GPU (Engine.greedy): each step ends with an argmax that writes the next
token where the following step reads it and 4 bytes for the host, and the step after is
submitted before the host reads that token (inputs are double-buffered), so host work overlaps
the GPU's. On a layer split the next step's first stage needs the token the last stage's
argmax wrote, which the host reads (separate devices share no semaphore): its inputs are
written while the last step ends, then the host waits for the token, writes it and runs the
step's stages, the last one left running while the token is yielded."""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from .step_graph import StepGraph
from .step_runner import StepRunner


def greedy_tokens(steps: StepRunner, token: int, seq_id: int, n: int, pipeline: bool) -> Iterator[int]:
    """Append `token` to `seq_id`, then yield the n tokens that follow, each the argmax of the
    last one's logits. pipeline: the step after a token is submitted before the token is
    yielded; when the consumer stops early that step is waited for and its KV cell forgotten,
    so the cache holds exactly the tokens evaluated for what was consumed."""
    inputs, cells, split, stats = steps.inputs, steps.inputs.cells, steps.split, steps.stats
    seqs = np.array([seq_id], np.int32)
    pending: list[tuple[int, int, StepGraph]] = []   # (inputs copy, position, graph) of steps in flight

    def submit(first: bool) -> None:
        parity = (pending[-1][0] ^ 1) if pending else 0
        t0 = time.perf_counter()
        pos = cells.length(seq_id)
        g, slots = steps.prepare(np.array([token], np.int32), seqs, np.array([pos], np.int32), parity=parity,
                                 chain=True, ids_on_gpu=not first and not split)
        if split and pending:   # pipelined: the step before is ending; its token is the input
            steps.wait(pending[-1][2].seqs[-1])
            inputs.write_token(parity, steps.readback.token(pending[-1][0]))
        if g.prefetched or g.hosted or split:   # uploads or host work between the layers, or stages: in order
            steps.run(g, parity, wait_last=not split)
        else:
            g.seqs[0].submit()
        inputs.advance(slots, 1)
        pending.append((parity, pos, g))
        stats.seconds += time.perf_counter() - t0

    def finish() -> int:
        parity, _, g = pending.pop(0)
        t1 = time.perf_counter()
        steps.wait(g.seqs[-1])
        out = steps.readback.token(parity)
        stats.add_step(1, time.perf_counter() - t1)
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
            cells.free(seq_id, pos)
        pending.clear()
