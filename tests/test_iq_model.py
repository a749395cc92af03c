"""A tiny model whose matrices are IQ quants (IQ4_XS attention, IQ2_XXS FFN; MoEs with IQ1_S and
MXFP4 experts, in VRAM and in host memory) or ternary ones (TQ2_0 attention, TQ1_0 FFN) gives the logits of its twin whose weights are the same
blocks dequantised to F32: prefill (the GEMM), decode (the mat-vec, the fused gate and up) and the
expert paths (mul_mat_id, prefetched, staged and read-in-place experts)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from vkrt.engine.engine import Engine
from vkrt.model.loader import Model
from vkrt.model.synthetic import SyntheticSpec, write_model

# 256-element rows (the IQ block); two KV heads of 64
DENSE = SyntheticSpec(arch="llama", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                      weight_type="IQ4_XS", ffn_type="IQ2_XXS", seed=21)
MOE = SyntheticSpec(arch="qwen3moe", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=0, n_expert=4,
                    n_expert_used=2, n_ff_expert=256, weight_type="IQ3_S", expert_type="IQ1_S", seed=22)
MOE_MXFP4 = dataclasses.replace(MOE, weight_type="IQ4_NL", expert_type="MXFP4", seed=23)
TERNARY = dataclasses.replace(DENSE, weight_type="TQ2_0", ffn_type="TQ1_0", seed=24)
PROMPT = [int(t) for t in np.random.default_rng(0).integers(3, 200, 24)]


def logits(device, path: str, n_cpu_moe: int = 0, stage_experts: bool | None = None):
    """Every prompt position's logits (one prefill of 24 tokens), then three decode steps'; and
    the type of each weight as loaded. n_cpu_moe: expert layers in host memory (prefill uploads
    them ahead, decode stages the chosen experts or reads them in place, by stage_experts)."""
    with (Model(device, path, progress=False, n_cpu_moe=n_cpu_moe) as model,
          Engine(model, n_ctx=64, n_ubatch=32, stage_experts=stage_experts) as engine):
        if n_cpu_moe:
            assert bool(engine.staging.layers) == stage_experts
        rows = [engine.eval(PROMPT, all_logits=True)]
        for t in (5, 17, 42):
            rows.append(engine.eval([t])[None])
        return np.concatenate(rows).astype(np.float64), {n: w.type.name for n, w in model.weights.items()}


def nmse(a, b) -> float:
    return float(np.sum((a - b) ** 2) / np.sum(b ** 2))


@pytest.mark.parametrize("spec", [DENSE, MOE, MOE_MXFP4, TERNARY], ids=["IQ4_XS+IQ2_XXS", "IQ3_S+IQ1_S experts",
                                                                         "IQ4_NL+MXFP4 experts", "TQ2_0+TQ1_0"])
def test_iq_model_equals_its_dequantised_twin(device, tmp_path, spec):
    quant = write_model(os.fspath(tmp_path / "iq.gguf"), spec)
    twin = write_model(os.fspath(tmp_path / "f32.gguf"), dataclasses.replace(spec, dequantized=True))
    got, types = logits(device, quant)
    ref, ref_types = logits(device, twin)
    expect = {spec.weight_type, spec.expert_type or spec.weight_type, spec.ffn_type or spec.weight_type}
    assert expect <= set(types.values()) and not expect & set(ref_types.values())
    # the logits depend on the weights and the input: positions differ from one another far more
    # than the two models do (their only difference is the order and rounding of the sums)
    spread = nmse(got[1:], got[:-1])
    assert spread > 1e-2, spread
    err = nmse(got, ref)
    assert err < 1e-9, f"normalised error {err:.3g} (positions differ by {spread:.3g})"
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).all()
    if spec.n_expert:   # experts in host memory: staged for decode, or read where they lie
        for stage in (True, False):
            host, _ = logits(device, quant, n_cpu_moe=spec.n_layer, stage_experts=stage)
            assert nmse(host, ref) < 1e-9, f"experts in host memory, staged={stage}"
