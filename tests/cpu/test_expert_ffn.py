"""The CPU expert FFN of a MoE layer against a numpy reference (dequantised weights, the same q8
activations)."""

import gguf
import numpy as np
import pytest

from vkrt.cpu.act_quant import dequantized, quantized
from vkrt.cpu.expert_ffn import ExpertFFN, ExpertStack
from vkrt.errors import VkrtError

from .dot_check import random_rows

pytestmark = pytest.mark.op

F16_FIELDS = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2)}


def _stack(name, type_name, k, rows, n_expert, rng, bias=False):
    data = random_rows(type_name, rows * n_expert, k, F16_FIELDS[type_name], rng=rng)
    row_bytes = data.shape[1]
    b = rng.standard_normal((n_expert, rows)).astype(np.float32) if bias else None
    return ExpertStack(name, data.reshape(-1), type_name, k, rows, n_expert, row_bytes, rows * row_bytes, b)


def _act(act, g, u):
    if act == "silu":
        return g / (1 + np.exp(-g)) * u
    if act == "gelu":
        return 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3))) * u
    x, y = np.minimum(g, 7), np.clip(u, -7, 7)
    return x / (1 + np.exp(-1.702 * x)) * (y + 1)


def _deq(stack, e):
    rows = stack.data[e * stack.expert_bytes:e * stack.expert_bytes + stack.rows * stack.row_bytes]
    return gguf.quants.dequantize(rows.reshape(stack.rows, stack.row_bytes),
                                  gguf.GGMLQuantizationType[stack.type_name]).astype(np.float64)


def _reference(ffn, x, experts, tokens, weights, out):
    g, u, d = ffn.gate, ffn.up, ffn.down
    xg = dequantized(*quantized(x, g.family)[:2], g.family)
    xu = dequantized(*quantized(x, u.family)[:2], u.family)
    hs = []
    for e, t in zip(experts, tokens):
        gv, uv = _deq(g, e) @ xg[t], _deq(u, e) @ xu[t]
        if g.bias.size:
            gv, uv = gv + g.bias[e], uv + u.bias[e]
        hs.append(_act(ffn.act, gv, uv))
    h = np.array(hs, np.float32)
    hq = dequantized(*quantized(h, d.family)[:2], d.family)
    for p, (e, t, wt) in enumerate(zip(experts, tokens, weights)):
        v = _deq(d, e) @ hq[p] + (d.bias[e] if d.bias.size else 0)
        out[t] += wt * v
    return out


@pytest.mark.parametrize("types,act,bias", [
    (("Q4_K", "Q4_K", "Q4_K"), "silu", False),
    (("Q4_0", "Q4_0", "Q8_0"), "gelu", False),
    (("Q8_0", "Q8_0", "Q4_0"), "swiglu_oai", True),
    (("Q4_K", "Q4_K", "Q8_0"), "silu", False),   # down reads q8_0 blocks of h, gate/up q8_K of x
])
def test_expert_ffn(types, act, bias):
    rng = np.random.default_rng(7)
    E, F, n_expert, T, k = 256, 512, 6, 3, 2
    gate = _stack("gate", types[0], E, F, n_expert, rng, bias)
    up = _stack("up", types[1], E, F, n_expert, rng, bias)
    down = _stack("down", types[2], F, E, n_expert, rng, bias)
    ffn = ExpertFFN(gate, up, down, act)
    x = rng.standard_normal((T, E)).astype(np.float32)
    ids = np.array([[0, 3], [3, 5], [1, 0]], np.int32)
    wts = rng.uniform(0.1, 1, (T, k)).astype(np.float32)
    experts, tokens, weights = ids.reshape(-1), np.repeat(np.arange(T, dtype=np.int32), k), wts.reshape(-1)
    out = rng.standard_normal((T, E)).astype(np.float32)
    ref = _reference(ffn, x, experts, tokens, weights, out.astype(np.float64))
    ffn.run(x, experts, tokens, weights, out)
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 2e-3 * scale, np.abs(out - ref).max() / scale


def test_refuses_unknown_type_and_bad_shapes():
    rng = np.random.default_rng(0)
    with pytest.raises(VkrtError, match="do not take type F16"):
        ExpertStack("blk.0.ffn_gate_exps.weight", np.zeros(64, np.uint8), "F16", 32, 1, 1, 64, 64)
    g = _stack("gate", "Q4_0", 64, 32, 2, rng)
    with pytest.raises(VkrtError, match="do not chain"):
        ExpertFFN(g, g, g, "silu")
