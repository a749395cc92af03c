"""llama.cpp's Q4_K_M mix for generated models (vkrt/model/quant_mix.py): its layer rule, the
types it gives each tensor, and a written file that holds them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as Q

from vkrt.errors import VkrtError
from vkrt.model.quant_mix import mix_types, use_more_bits
from vkrt.model.synthetic import SyntheticSpec, write_model


def test_use_more_bits_of_40_layers():
    # the first and last eighth (0-4, 35-39) and every third layer between from 7 on
    assert [i for i in range(40) if use_more_bits(i, 40)] == [0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34,
                                                              35, 36, 37, 38, 39]


def test_q4_k_m_types():
    tensors = [("token_embd.weight", 256, Q.Q8_0), ("output.weight", 256, Q.Q8_0),
               ("blk.0.attn_qkv.weight", 256, Q.Q4_K), ("blk.0.ffn_down_exps.weight", 256, Q.Q4_K),
               ("blk.1.ffn_down_shexp.weight", 256, Q.Q4_K), ("blk.1.attn_v.weight", 256, Q.Q4_K),
               ("blk.3.attn_v.weight", 256, Q.Q4_K), ("blk.3.ffn_down.weight", 256, Q.Q4_K),
               ("blk.3.ffn_gate_exps.weight", 256, Q.Q4_K), ("blk.2.attn_output.weight", 1408, Q.Q4_0),
               ("blk.2.attn_norm.weight", 256, Q.F32)]
    got = dict(zip((n for n, _, _ in tensors), mix_types("Q4_K_M", tensors, n_layer=8)))
    assert got == {"token_embd.weight": Q.Q4_K, "output.weight": Q.Q6_K,
                   "blk.0.attn_qkv.weight": Q.Q5_K,
                   "blk.0.ffn_down_exps.weight": Q.Q6_K,     # layer 0 < 8 / 8
                   "blk.1.ffn_down_shexp.weight": Q.Q4_K,
                   "blk.1.attn_v.weight": Q.Q4_K,            # the first of 2 attn_v: 0 < 2 / 8 is false
                   "blk.3.attn_v.weight": Q.Q6_K,            # the second: 1 >= 7 * 2 / 8
                   "blk.3.ffn_down.weight": Q.Q6_K,          # (3 - 1) % 3 == 2
                   "blk.3.ffn_gate_exps.weight": Q.Q4_K,
                   "blk.2.attn_output.weight": Q.Q4_0,       # 1408-value rows are no whole 256-value blocks
                   "blk.2.attn_norm.weight": Q.F32}


def test_unknown_mix_is_refused():
    with pytest.raises(VkrtError, match="Q4_K_S"):
        mix_types("Q4_K_S", [("output.weight", 256, Q.Q8_0)], 1)


def test_written_model_holds_the_mix(tmp_path):
    spec = SyntheticSpec(arch="qwen35moe", n_layer=4, n_embd=256, head_dim=64, rope_dims=16, ssm_head_dim=64, n_ff=0,
                         n_expert=4, n_expert_used=2, n_ff_expert=256, n_ff_shared=256, weight_type="Q4_K",
                         rope_sections=(4, 2, 2, 0), random_blocks=True, mix="Q4_K_M")
    path = write_model(tmp_path / "mix.gguf", spec)
    types = {t.name: t.tensor_type for t in GGUFReader(path).tensors}
    assert types["output.weight"] == Q.Q6_K and types["token_embd.weight"] == Q.Q4_K
    assert types["blk.0.attn_qkv.weight"] == Q.Q5_K                 # a DeltaNet layer's fused q/k/v
    assert types["blk.3.attn_v.weight"] == Q.Q6_K                   # the one attention layer's
    downs = {il: types[f"blk.{il}.ffn_down_exps.weight"] for il in range(4)}
    assert downs == {0: Q.Q4_K, 1: Q.Q4_K, 2: Q.Q6_K, 3: Q.Q6_K}     # (2 - 0) % 3 == 2; 3 >= 7 * 4 / 8
    assert types["blk.1.ffn_gate_exps.weight"] == Q.Q4_K and types["blk.1.attn_norm.weight"] == Q.F32


def test_make_moe_model_refuses_expert_type_with_a_mix(tmp_path):
    script = Path(__file__).resolve().parents[1] / "bench" / "make_moe_model.py"
    out = tmp_path / "m.gguf"
    proc = subprocess.run([sys.executable, str(script), str(out), "--type", "Q4_K_M", "--expert-type", "IQ3_XXS"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "--expert-type IQ3_XXS with --type Q4_K_M" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
