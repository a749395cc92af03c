"""Wavefront: several steps through the stages of a layer split as a pipeline. At tick t stage k
runs step t - k, so while stage k runs step i, stage k - 1 runs step i + 1; each tick submits
every busy stage, waits for them all, hands the activations on (copy `parity` of the handoffs:
neighbouring steps alternate) and reads the outputs of the step the last stage finished. A
prompt's micro-batches run so (StepRunner.pipelined), and, with Engine(pipeline_steps=True), the
groups of sequences a server's step is split into (StepRunner.run_groups)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ops.mat_vec import mat_vec_most
from ..ops.matmul import gemm_tuning


@dataclass
class WaveStep:
    """One step of a wavefront: its graph (one part a stage), the bytes of its step inputs (each
    stage copies them into its own input buffer, copy `parity`, when it takes the step up), what
    to do just before the last stage runs it (write tables the last stage reads: logit
    adjustments, token masks) and after (read its outputs)."""

    graph: object
    inputs: bytes
    parity: int
    finish: Callable[[], None]
    before_last: Callable[[], None] | None = None


def run_wavefront(stages: list, handoffs: list, n_steps: int, prepare: Callable[[int], WaveStep],
                  wait: Callable) -> int:
    """Run n_steps steps through `stages`; prepare(i) is called at the tick step i enters the
    first stage (every earlier step has then left it) and writes its inputs. Returns how many
    layers the stages prefetched."""
    n_stages, prefetched = len(stages), 0
    flight: dict[int, WaveStep] = {}
    for tick in range(n_steps + n_stages - 1):
        if tick < n_steps:
            flight[tick] = prepare(tick)
        busy = [(k, tick - k) for k in range(n_stages) if 0 <= tick - k < n_steps]
        for k, u in busy:
            step = flight[u]
            st = stages[k]
            if k:
                base = step.parity * st.inputs_size
                st.inputs.host_bytes[base:base + st.inputs_size] = step.inputs
            if k == n_stages - 1 and step.before_last is not None:
                step.before_last()
            prefetched += st.submit(step.graph.stages[k])
        for k, u in busy:
            wait(flight[u].graph.stages[k].seqs[-1])
        for k, u in busy:
            step = flight[u]
            if k < len(handoffs):
                handoffs[k].carry(step.parity, 4 * stages[k].model.cfg.n_embd * step.graph.opts.n_tokens)
            else:
                step.finish()
                del flight[u]
    return prefetched


def balanced_groups(sizes: list[int], n_groups: int) -> list[range]:
    """Consecutive runs of parts (sizes: tokens each) in n_groups non-empty groups of about the
    same tokens."""
    cum = [0]
    for s in sizes:
        cum.append(cum[-1] + s)
    cuts = [0]
    for g in range(1, n_groups):
        target = cum[-1] * g / n_groups
        lo, hi = cuts[-1] + 1, len(sizes) - (n_groups - g)   # each group keeps at least one part
        cuts.append(min(range(lo, hi + 1), key=lambda c: abs(cum[c] - target)))
    cuts.append(len(sizes))
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def same_kernels(tunings: list, moe: bool, n: int, m: int) -> bool:
    """Whether a step of m tokens runs the kernels one of n does where the choice could change
    the sums a token's row gets, on every device (`tunings`): the mat-vec or the GEMM for dense
    matmuls (a mat-vec run's columns are summed alike however many there are), with experts
    (`moe`) for mul_mat_id (decode-sized experts staged up to mv_max_n, mat-vecs, fused or not, up to
    mv_id_max_n, the GEMM past it), the GEMM's split along K (by gemm_tuning's tile and its token tiles,
    up to mm_split_max_tiles), and
    flash attention's packing of a KV head's query heads (its KV split the engine pins:
    RecordOptions.fa_plan_tokens)."""
    def kind(t, k: int) -> tuple:
        g = gemm_tuning(t, k)   # the dense GEMM's tile (mul_mat_id's adds K alike, unsplit, whatever its tile)
        return (k <= mat_vec_most(t), moe and k <= t.mv_max_n,
                moe and k <= t.mv_id_max_n, k <= t.fa_pack_max_q,
                (g.mm_bm, g.mm_bn, -(-k // g.mm_bn)) if g.mm_split_groups > 0 and k <= g.mm_bn * g.mm_split_max_tiles
                else 0)
    return all(kind(t, n) == kind(t, m) for t in tunings)
