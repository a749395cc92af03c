"""The routed experts' FFN of one MoE layer on the CPU: for each chosen (token, expert) pair
h = act(gate·x) * (up·x), then out[token] += weight * (down·h), with x and h quantised to the
q8 blocks of the weight type that reads them. Two parallel passes (gate/up rows, then down rows),
each spread over numba's threads; the expert tensors are read where they lie."""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from ..errors import VkrtError
from .act_quant import FAMILIES, quantized
from .dot_types import DOTS

ACTIVATIONS = {"silu": 0, "gelu": 1, "swiglu_oai": 2}
ROWS_PER_ITEM = 16   # rows of one expert a thread takes at a time


@njit(inline="always")
def _act(kind, g, u):
    if kind == 0:
        return g / (np.float32(1) + math.exp(-g)) * u
    if kind == 1:
        c = np.float32(0.7978845608028654)
        return np.float32(0.5) * g * (np.float32(1) + math.tanh(c * (g + np.float32(0.044715) * g * g * g))) * u
    x = min(g, np.float32(7))
    y = min(max(u, np.float32(-7)), np.float32(7))
    return x / (np.float32(1) + math.exp(np.float32(-1.702) * x)) * (y + np.float32(1))


@functools.cache
def gate_up_kernel(gate_type: str, up_type: str, act: str):
    """h[p] = act(gate[e_p]·x[t_p] + bg, up[e_p]·x[t_p] + bu) for every pair p; the pairs come
    grouped by expert (group g: pairs starts[g]..starts[g+1]-1), a thread takes a group's chunk of
    rows and each row, read once, meets every token of the group."""
    dot_g, dot_u = DOTS[gate_type][1], DOTS[up_type][1]
    kind = ACTIVATIONS[act]

    @njit(parallel=True, nogil=True)
    def run(wg, wu, eg, eu, rg, ru, nbg, nbu, starts, ex, tok, qg, dg, sg, qu, du, su, bg, bu, h):
        rows = h.shape[1]
        chunks = (rows + ROWS_PER_ITEM - 1) // ROWS_PER_ITEM
        for item in prange((starts.size - 1) * chunks):
            grp = item // chunks
            e = np.int64(ex[starts[grp]])
            for r in range((item % chunks) * ROWS_PER_ITEM, min(rows, (item % chunks + 1) * ROWS_PER_ITEM)):
                for p in range(starts[grp], starts[grp + 1]):
                    t = tok[p]
                    g = dot_g(wg, e * eg + r * rg, qg[t], dg[t], sg[t], nbg)
                    u = dot_u(wu, e * eu + r * ru, qu[t], du[t], su[t], nbu)
                    if bg.shape[0]:
                        g += bg[e, r]
                        u += bu[e, r]
                    h[p, r] = _act(kind, g, u)

    return run


@functools.cache
def down_kernel(down_type: str):
    """out[t_p] += weight_p * (down[e_p]·h[p] + bd) over the pairs (grouped by expert: a row is
    read once for a group), a thread per rows chunk."""
    dot_d = DOTS[down_type][1]

    @njit(parallel=True, nogil=True)
    def run(wd, ed, rd, nbd, ex, tok, wt, qh, dh, sh, bd, out):
        rows = out.shape[1]
        chunks = (rows + ROWS_PER_ITEM - 1) // ROWS_PER_ITEM
        for c in prange(chunks):
            for r in range(c * ROWS_PER_ITEM, min(rows, (c + 1) * ROWS_PER_ITEM)):
                for p in range(ex.size):
                    e = np.int64(ex[p])
                    v = dot_d(wd, e * ed + r * rd, qh[p], dh[p], sh[p], nbd)
                    if bd.shape[0]:
                        v += bd[e, r]
                    out[tok[p], r] += wt[p] * v

    return run


class ExpertStack:
    """One expert tensor of a layer as the CPU reads it: `data` the uint8 bytes of all experts
    (expert e's row r at e * expert_bytes + r * row_bytes), its GGUF type, K (values a row) and
    rows; `bias` float32 [n_expert, rows] or None."""

    def __init__(self, name: str, data: np.ndarray, type_name: str, k: int, rows: int, n_expert: int,
                 row_bytes: int, expert_bytes: int, bias: np.ndarray | None = None):
        if type_name not in DOTS:
            raise VkrtError(f"{name}: the CPU expert kernels do not take type {type_name} "
                            f"(they take {', '.join(DOTS)})")
        block = FAMILIES[DOTS[type_name][0]][0]
        if k % block:
            raise VkrtError(f"{name}: rows of {k} values are not a whole number of {block}-value blocks")
        if data.dtype != np.uint8 or data.ndim != 1 or data.size < (n_expert - 1) * expert_bytes + rows * row_bytes:
            raise VkrtError(f"{name}: host bytes ({data.size}) do not hold {n_expert} experts of {rows} rows")
        self.name, self.data, self.type_name = name, data, type_name
        self.k, self.rows, self.n_expert = k, rows, n_expert
        self.row_bytes, self.expert_bytes = row_bytes, expert_bytes
        self.family = DOTS[type_name][0]
        self.blocks = k // block
        self.bias = np.zeros((0, 0), np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)

    @property
    def nbytes_per_expert(self) -> int:
        return self.rows * self.row_bytes


_NO_BIAS = np.zeros((0, 0), np.float32)


class ExpertFFN:
    """The routed experts of one MoE layer on the CPU (gate, up, down: ExpertStacks; `act` one of
    ACTIVATIONS). run() adds the weighted expert outputs of the chosen pairs into `out`."""

    def __init__(self, gate: ExpertStack, up: ExpertStack, down: ExpertStack, act: str):
        if act not in ACTIVATIONS:
            raise VkrtError(f"the CPU expert kernels do not take activation {act!r} (they take {', '.join(ACTIVATIONS)})")
        if gate.rows != up.rows or down.k != gate.rows or gate.k != up.k:
            raise VkrtError(f"{gate.name}, {up.name}, {down.name}: shapes do not chain "
                            f"(gate {gate.k}x{gate.rows}, up {up.k}x{up.rows}, down {down.k}x{down.rows})")
        self.gate, self.up, self.down, self.act = gate, up, down, act
        self._gate_up = gate_up_kernel(gate.type_name, up.type_name, act)
        self._down = down_kernel(down.type_name)

    def expert_bytes(self) -> int:
        """Bytes of weights one expert's FFN reads."""
        return self.gate.nbytes_per_expert + self.up.nbytes_per_expert + self.down.nbytes_per_expert

    def run(self, x: np.ndarray, experts: np.ndarray, tokens: np.ndarray, weights: np.ndarray,
            out: np.ndarray) -> None:
        """out[tokens[p]] += weights[p] * FFN_{experts[p]}(x[tokens[p]]) for every pair p; x and out
        float32 [n_tokens, n_embd]."""
        if experts.size == 0:
            return
        g, u, d = self.gate, self.up, self.down
        xq = [quantized(x, g.family)]
        xq.append(xq[0] if u.family == g.family else quantized(x, u.family))
        h = np.empty((experts.size, g.rows), np.float32)
        order = np.argsort(experts, kind="stable")   # by expert: a row read once serves its tokens
        ex, tok = experts[order].astype(np.int32), tokens[order].astype(np.int32)
        weights = weights[order]
        starts = np.flatnonzero(np.concatenate(([True], ex[1:] != ex[:-1], [True]))).astype(np.int64)
        bg = g.bias if g.bias.size else _NO_BIAS
        bu = u.bias if u.bias.size else (np.zeros_like(bg) if bg.size else _NO_BIAS)
        self._gate_up(g.data, u.data, g.expert_bytes, u.expert_bytes, g.row_bytes, u.row_bytes, g.blocks, u.blocks,
                      starts, ex, tok, *xq[0], *xq[1], bg, bu, h)
        hq = quantized(h, d.family)
        self._down(d.data, d.expert_bytes, d.row_bytes, d.blocks, ex, tok, weights.astype(np.float32, copy=False),
                   *hq, d.bias if d.bias.size else _NO_BIAS, out)

