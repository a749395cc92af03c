"""Architectures as data (vkrt/model/arch.py) and the metadata keys named once
(vkrt/model/metadata_keys.py): every architecture's tiny model round-trips SyntheticSpec ->
metadata -> ModelConfig, and the generator writes only keys the table names."""

from __future__ import annotations

import dataclasses
import math

import pytest

from models import TINY
from vkrt.model.arch import ARCHS, DeltaNet, Packing, QKNorm, Router, Scales, experts_of, with_layout
from vkrt.model.config import ModelConfig
from vkrt.model.gguf_file import GGUFFile
from vkrt.model.metadata_keys import KEYS
from vkrt.model.synthetic import write_model
from vkrt.model.tensors import file_layout

# one tiny model of each architecture (the first TINY lists)
FIRST_OF_ARCH = {s.arch: name for name, s in reversed(list(TINY.items()))}


def test_every_architecture_has_a_tiny_model():
    assert set(FIRST_OF_ARCH) == set(ARCHS)


def test_keys_are_named_once():
    assert len({k.name for k in KEYS}) == len(KEYS) and len({k.field for k in KEYS}) == len(KEYS)


def expected_numbers(s, spec) -> dict:
    """The ModelConfig numbers a file written from SyntheticSpec `s` must give."""
    out = dict(n_layer=s.n_layer, n_embd=s.n_embd, n_head=s.n_head, n_head_kv=s.n_head_kv, head_dim_k=s.head_dim,
               head_dim_v=s.head_dim, n_ctx_train=s.n_ctx, rope_dims=s.rope_dims or s.head_dim, rope_base=s.rope_base,
               sliding_window=s.sliding_window if spec.layers.swa_pattern else 0)
    if spec.moe is not None:   # sigmoid-routed files carry their routing weights' norm and scale
        sigmoid = spec.moe.router is Router.SIGMOID
        out.update(n_expert=s.n_expert, n_expert_used=s.n_expert_used, n_ff_expert=s.n_ff_expert,
                   n_ff_shared=s.n_ff_shared, expert_weights_scale=s.expert_weights_scale if sigmoid else 0.0,
                   expert_weights_norm=s.expert_weights_norm if sigmoid else spec.moe.weights_norm)
    if spec.moe is None or spec.moe.dense_lead:
        out.update(n_ff=s.n_ff)
    if spec.layers.delta_net is not DeltaNet.NONE:
        out.update(ssm_conv_kernel=s.ssm_conv_kernel, ssm_head_dim=s.ssm_head_dim or s.head_dim,
                   ssm_k_heads=s.ssm_k_heads, ssm_v_heads=s.ssm_v_heads)
    if spec.scales is Scales.GRANITE:
        out.update(embd_scale=s.embedding_scale or 1.0, residual_scale=s.residual_scale, logit_scale=s.logit_scale)
    if spec.scales is Scales.SQRT_EMBD:
        out.update(embd_scale=math.sqrt(s.n_embd))
    out.update(attn_scale=s.attention_scale or 1 / math.sqrt(s.head_dim))
    if s.rope_scaling:
        out.update(rope_scale=1 / s.rope_scaling_factor)
    if s.rope_orig_ctx:
        out.update(n_ctx_orig_yarn=s.rope_orig_ctx)
    return out


@pytest.mark.parametrize("name", sorted(FIRST_OF_ARCH.values()))
def test_synthetic_metadata_round_trips(tmp_path, name):
    """What the generator writes for each architecture is what ModelConfig reads back: the
    numbers of the SyntheticSpec, and the architecture's spec settled by the file (its experts,
    its optional q/k norms, its packed projections as the spec asked)."""
    s = TINY[name]
    path = write_model(tmp_path / f"{name}.gguf", s)
    with GGUFFile(path, progress=False) as f:
        meta, tensors = dict(f.metadata), f.tensors
    cfg = file_layout(ModelConfig.from_metadata(meta, path), tensors)
    arch = ARCHS[s.arch]
    spec = with_layout(dataclasses.replace(arch, moe=experts_of(arch, s.n_expert)), qk_norm=s.qk_norm,
                       qkv_fused=s.qkv_fused, qkvz_fused=s.qkvz_fused)
    assert cfg.spec == spec
    assert spec.attn.qk_norm is not QKNorm.PER_HEAD_OPTIONAL and Packing.EITHER not in (spec.attn.qkv, spec.layers.qkvz)
    got = {k: getattr(cfg, k) for k in expected_numbers(s, spec)}
    assert got == pytest.approx(expected_numbers(s, spec))
    assert cfg.vocab_size == len(meta["tokenizer.ggml.tokens"])
    named = {f"{s.arch}.{k.name}" for k in KEYS}
    extra = set(s.extra)
    assert {k for k in meta if k.startswith(f"{s.arch}.")} - extra <= named


def test_optional_parts_settle_both_ways(tmp_path):
    """glm4moe's optional q/k norms and phi3's fused q/k/v are settled by the file's tensors;
    llama's experts by its expert_count."""
    for name, change, attr, values in (("tiny-glm4moe", "qk_norm", "qk_norm", (QKNorm.PER_HEAD, QKNorm.NONE)),
                                       ("tiny-phi3", "qkv_fused", "qkv", (Packing.FUSED, Packing.SEPARATE))):
        for on, want in zip((True, False), values):
            path = write_model(tmp_path / f"{name}-{on}.gguf", dataclasses.replace(TINY[name], **{change: on}))
            with GGUFFile(path, progress=False) as f:
                cfg = file_layout(ModelConfig.from_metadata(dict(f.metadata), path), f.tensors)
            assert getattr(cfg.spec.attn, attr) is want, (name, on)
    assert experts_of(ARCHS["llama"], 0) is None and experts_of(ARCHS["llama"], 4).optional is False
