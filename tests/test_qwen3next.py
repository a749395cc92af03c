"""Qwen3-Next (GGUF `qwen3next`, llama.cpp's src/models/qwen3next.cpp): the tiny models against the
float64 numpy forward pass of hybrid_reference.py, which follows llama.cpp's graph (the DeltaNet
tensors grouped by key head: ssm_in or attn_qkv / attn_gate, and ssm_ba; value head j reading key
head j // (Hv / Hk); NEOX RoPE on rope.dimension_count dims). test_hybrid_reference.py runs the
same models through prompts of every ubatch form, decode after a chunked prefill and two sequences;
here: prefill then decode with the experts in VRAM, on the host and through the expert cache, the
file forms' tensors, and the errors a broken file gets.

Pairing value heads with key heads tiled (qwen35's j % Hk) instead of interleaved moves the
reference by far more than the tolerance (test_the_reference_is_sensitive), as does reading the
file's ssm_ba halves the other way round.
"""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest

import hybrid_reference
from hybrid_reference import fresh_logits
from models import tiny_model
from test_hybrid_reference import check_logits, normalised_error
from test_olmoe import assert_missing_tensor_named, rewrite
from vkrt.errors import GGUFError, VkrtError
from vkrt.memory import F32
from vkrt.model.arch import LINEAR, MOE_SHARED, Packing, RopeKind
from vkrt.model.delta_net_layout import tiled_heads
from vkrt.model.loader import Model

TOKENS = [3, 17, 42, 5, 99, 120, 7, 64, 11, 200, 31, 8, 77, 150, 2, 45]
PREFILL = 12
TIGHT = 1e-4     # normalised error per position, F32 KV cache
F16_KV = 2e-3    # the default F16 KV cache
MODELS = ["tiny-qwen3next", "tiny-qwen3next-qkv"]


@pytest.fixture(scope="module", params=MODELS)
def qwen3next(request, tmp_path_factory):
    path = tiny_model(request.param, tmp_path_factory.mktemp("qwen3next"))
    return path, hybrid_reference.forward(path, TOKENS)


def test_config_and_tensors(device, qwen3next):
    path = qwen3next[0]
    fused = "qkv" not in path
    with Model(device, path, progress=False) as m:
        cfg = m.cfg
        assert cfg.arch == "qwen3next" and cfg.spec.rope.kind is RopeKind.NEOX and cfg.rope_dims == 8
        assert not cfg.rope_sections and cfg.spec.layers.qkvz is (Packing.FUSED if fused else Packing.SEPARATE)
        assert cfg.ssm_k_heads == 2 and cfg.ssm_v_heads == 4
        assert [layer.attn == LINEAR for layer in cfg.layers] == [True, True, True, False]
        assert all(layer.ffn == MOE_SHARED for layer in cfg.layers)
        # the kernels' tensors under qwen35's names; the file's fused ones are not uploaded
        assert "blk.0.ssm_beta.weight" in m.weights and "blk.0.ssm_ba.weight" not in m.weights
        assert ("blk.0.ssm_in.weight" in m.weights) is False
        assert m.weights["blk.0.attn_qkv.weight"].ne[:2] == (64, cfg.ssm_conv_dim)
        assert m.weights["blk.0.attn_gate.weight"].ne[:2] == (64, 64)


def test_file_names_are_the_converters(qwen3next):
    """Every tensor is one gguf-py lists for MODEL_ARCH.QWEN3NEXT."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
    known = {TENSOR_NAMES[t].format(bid=il) for t in MODEL_TENSORS[MODEL_ARCH.QWEN3NEXT] for il in range(4)}
    names = {t.name for t in gguf.GGUFReader(qwen3next[0]).tensors}
    assert {n.rsplit(".", 1)[0] if n.endswith((".weight", ".bias")) else n for n in names} <= known
    fused = "qkv" not in qwen3next[0]
    assert ("blk.0.ssm_in.weight" in names) == fused and ("blk.0.attn_qkv.weight" in names) != fused
    assert "blk.0.ssm_ba.weight" in names and "qwen3next.rope.dimension_sections" not in \
        gguf.GGUFReader(qwen3next[0]).fields


def test_tiled_heads():
    """Kernel head r * Hk + g holds the file's head g * rep + r (Hk = 2, rep = 3)."""
    assert tiled_heads(2, 6).tolist() == [0, 3, 1, 4, 2, 5]
    assert tiled_heads(4, 4).tolist() == [0, 1, 2, 3]
    order = tiled_heads(2, 6)
    assert ((np.arange(6) % 2) == order // 3).all()   # kernel head n reads key head n % Hk


@pytest.mark.parametrize("n_cpu_moe,flash,kv_type,tol", [(0, True, F32, TIGHT), (0, False, F32, TIGHT),
                                                         (4, True, F32, TIGHT), (0, True, None, F16_KV)])
def test_logits_match_the_numpy_forward(device, qwen3next, n_cpu_moe, flash, kv_type, tol):
    """A 12-token prefill (all logits), then 4 decode steps; n_cpu_moe 4: every layer's experts in
    host memory. kv_type None: the engine's default F16 KV cache."""
    path, ref = qwen3next
    got = fresh_logits(device, path, TOKENS, PREFILL, n_cpu_moe=n_cpu_moe, flash=flash, kv_type=kv_type)
    check_logits(got, ref, tol, f"{path}, n_cpu_moe={n_cpu_moe}, flash={flash}, kv {kv_type}")


def test_host_layers(device, qwen3next):
    """-ngl 2: the first two layers' tensors (the DeltaNet's rebuilt ones included) in host memory."""
    path, ref = qwen3next
    with Model(device, path, progress=False, n_gpu_layers=2) as m:
        assert "blk.0.attn_qkv.weight" in m.placement.host_tensors
    got = fresh_logits(device, path, TOKENS, PREFILL, kv_type=F32, n_gpu_layers=2)
    check_logits(got, ref, TIGHT, f"{path}, -ngl 2")


def test_the_reference_is_sensitive(qwen3next):
    """Tiled key heads (qwen35's pairing) change the logits far beyond the tolerance."""
    path, ref = qwen3next
    worst = normalised_error(hybrid_reference.forward(path, TOKENS, interleaved=False), ref).max()
    assert worst > 10 * F16_KV, f"tiled key heads change the logits by {worst:.2e} only"


def test_swapped_beta_alpha_is_seen(qwen3next, tmp_path):
    """A file whose ssm_ba halves are swapped (alpha first) gives other logits: the reference
    reads beta first, as llama.cpp does."""
    path, ref = qwen3next
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "swapped.gguf"), "qwen3next")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            w.add_key_value(field.name, field.contents(), field.types[0],
                            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        data = t.data
        if t.name.endswith("ssm_ba.weight"):   # rows [b0 b1 a0 a1] per key head -> [a0 a1 b0 b1]
            rows = np.asarray(data).reshape(2, 2, 2, -1)[:, ::-1].reshape(np.asarray(data).shape)
            data = np.ascontiguousarray(rows)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    worst = normalised_error(hybrid_reference.forward(str(tmp_path / "swapped.gguf"), TOKENS), ref).max()
    assert worst > 10 * F16_KV


@pytest.mark.parametrize("missing", ["blk.1.ssm_ba.weight", "blk.0.ssm_conv1d.weight", "blk.3.attn_q_norm.weight",
                                     "blk.2.ffn_gate_inp_shexp.weight"])
def test_missing_tensors_are_named(device, qwen3next, tmp_path, missing):
    assert_missing_tensor_named(device, qwen3next[0], tmp_path, "qwen3next", missing)


def test_missing_projection_is_named(device, tmp_path_factory, tmp_path):
    """Without ssm_in, a file must hold attn_qkv / attn_gate: the error names them."""
    path = tiny_model("tiny-qwen3next", tmp_path_factory.mktemp("qwen3next-fused"))
    broken = rewrite(path, tmp_path / "no_ssm_in.gguf", "qwen3next", drop_tensor="blk.0.ssm_in.weight")
    with pytest.raises(GGUFError, match=r"blk\.0\.attn_qkv\.weight"):
        Model(device, broken, progress=False)


def test_wrong_shape_is_named(tmp_path_factory):
    from vkrt.model.config import ModelConfig
    from vkrt.model.gguf_file import GGUFFile
    from vkrt.model.tensors import check_tensors, file_layout
    path = tiny_model("tiny-qwen3next", tmp_path_factory.mktemp("qwen3next-shape"))
    with GGUFFile(path, progress=False) as f:
        meta, tensors = dict(f.metadata), f.tensors
    cfg = file_layout(ModelConfig.from_metadata(meta, "m.gguf"), tensors)
    ba = tensors["blk.0.ssm_ba.weight"]
    with pytest.raises(GGUFError, match=r"blk\.0\.ssm_ba\.weight has shape \[64, 4\], expected \[64, 8\]"):
        check_tensors(cfg, {**tensors, ba.name: dataclasses.replace(ba, ne=(64, 4))}, "m.gguf")


def test_inconsistent_heads_are_refused(tmp_path_factory, tmp_path):
    path = tiny_model("tiny-qwen3next", tmp_path_factory.mktemp("qwen3next-heads"))
    from vkrt.model.config import ModelConfig
    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    meta["qwen3next.ssm.group_count"] = 3
    with pytest.raises(VkrtError, match=r"ssm\.time_step_rank 4 is not a multiple of ssm\.group_count 3"):
        ModelConfig.from_metadata(meta, "m.gguf")
