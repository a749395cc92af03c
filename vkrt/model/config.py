"""ModelConfig: the hyper-parameters of a GGUF model, read once from its metadata keys
(metadata_keys.py), with the architecture's spec (arch.py) and one LayerSpec per layer."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from .arch import (ARCHS, LINEAR, SLIDING, ArchSpec, DeltaNet, LayerSpec, RopeKind, Router, Scales, SharedExpert,
                   Window, experts_of, layer_specs)
from .metadata_keys import ConfigMissing, read_keys

log = logging.getLogger("vkrt")


@dataclass(frozen=True)
class ModelConfig:
    """The file's numbers (named after its keys) and `spec`, the architecture's choices as this
    file settles them (arch.py); `layers` says what each layer is."""

    arch: str
    spec: ArchSpec
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_ctx_train: int
    norm_eps: float
    rope_dims: int
    rope_base: float
    rope_scale: float              # freq_scale (1 / the rope.scaling.factor)
    attn_scale: float
    vocab_size: int
    layers: tuple[LayerSpec, ...] = ()
    # ggml_rope_ext's attn_factor, and YaRN's (rope.scaling.type yarn) ext_factor and n_ctx_orig
    # (LongRoPE's original context too)
    rope_attn_factor: float = 1.0
    rope_ext_factor: float = 0.0
    n_ctx_orig_yarn: int = 0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    rope_base_swa: float = 0.0     # sliding layers' (0: rope_base)
    rope_sections: tuple[int, ...] = ()   # qwen35's multi-section RoPE
    # mistral3: the queries' temperature (attention.temperature_scale; 0: none) and its floor scale
    attn_temp_scale: float = 0.0
    attn_temp_floor: int = 0
    # gemma3 (sqrt(n_embd)), granite ({arch}.embedding_scale)
    embd_scale: float = 1.0
    # granite: each block's output times residual_scale before the residual add (0: none); the
    # logits divided by logit_scale
    residual_scale: float = 0.0
    logit_scale: float = 1.0
    sliding_window: int = 0        # 0: every layer attends to everything
    # mixture of experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    n_ff_shared: int = 0
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0   # the routing weights times it (0 or 1: not scaled; glm4moe)
    n_dense_lead: int = 0          # blocks with a dense FFN before the experts' (glm4moe; MTP blocks count too)
    # Gated DeltaNet layers (qwen35, qwen3next)
    ssm_conv_kernel: int = 0       # causal conv window (4)
    ssm_head_dim: int = 0          # q/k/v head size of the DeltaNet layers (ssm.state_size)
    ssm_k_heads: int = 0           # query/key heads (ssm.group_count)
    ssm_v_heads: int = 0           # value heads (ssm.time_step_rank)
    n_layer_nextn: int = 0         # multi-token-prediction blocks after the trunk (not run)

    @property
    def moe(self) -> bool:
        return any(layer.moe for layer in self.layers)

    @property
    def kv_layers(self) -> list[int]:
        """Layers with a KV cache (full or sliding attention)."""
        return [il for il, layer in enumerate(self.layers) if layer.has_kv]

    @property
    def linear_layers(self) -> list[int]:
        """Gated DeltaNet layers (a recurrent state per sequence instead of KV)."""
        return [il for il, layer in enumerate(self.layers) if layer.attn == LINEAR]

    @property
    def pos_streams(self) -> int:
        """Position streams per token: 4 (t, h, w, e) with multi-section RoPE, else 1."""
        return 4 if self.spec.rope.kind is RopeKind.IMROPE else 1

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the DeltaNet projection the conv runs over: q, k (Hk heads) and v (Hv heads)."""
        return (2 * self.ssm_k_heads + self.ssm_v_heads) * self.ssm_head_dim

    @property
    def recurrent_floats(self) -> int:
        """fp32 values of one sequence's state in one DeltaNet layer: conv window + delta-rule matrix."""
        D = self.ssm_head_dim
        return (self.ssm_conv_kernel - 1) * self.ssm_conv_dim + self.ssm_v_heads * D * D

    def layer_is_swa(self, il: int) -> bool:
        return bool(self.layers) and self.layers[il].attn == SLIDING

    def layer_rope_base(self, il: int) -> float:
        return self.rope_base_swa if self.layer_is_swa(il) and self.rope_base_swa else self.rope_base

    def layer_rope_scale(self, il: int) -> float:
        swa_scale = self.spec.rope.swa_scale
        return swa_scale if self.layer_is_swa(il) and swa_scale else self.rope_scale

    @staticmethod
    def from_metadata(meta: dict, path: str = "model") -> "ModelConfig":
        arch = meta.get("general.architecture")
        if arch not in ARCHS:
            raise ConfigMissing(f"{path}: general.architecture={arch!r} is not supported "
                                f"(supported: {', '.join(sorted(ARCHS))})")
        base, tokens = ARCHS[arch], meta.get("tokenizer.ggml.tokens")
        v = read_keys(meta, arch, base, path, len(tokens) if tokens is not None else None)
        spec = replace(base, moe=experts_of(base, v["n_expert"]))
        n_blocks, n_nextn = v["n_blocks"], v["n_layer_nextn"]
        if not 0 <= n_nextn < n_blocks:
            raise ConfigMissing(f"{path}: {arch}.nextn_predict_layers={n_nextn} must be below block_count={n_blocks}")
        sigmoid = spec.moe is not None and spec.moe.router is Router.SIGMOID
        if v["expert_weights_scale"] not in (0, 1) and not sigmoid:
            raise ConfigMissing(f"{path}: {arch}.expert_weights_scale={v['expert_weights_scale']} is not supported "
                                f"(only 0 or 1)")
        kw: dict = dict(expert_weights_scale=v["expert_weights_scale"], **_rope_scaling(v, arch, spec, path))
        window = 0
        if spec.layers.swa_pattern:
            window = v["sliding_window"] or 0
            kw.update(sliding_window=window, rope_base_swa=v["rope_base_swa"])
        if spec.layers.window is Window.NOT_APPLIED and (v["sliding_window"] or 0) > 0:
            log.warning("%s: %s.attention.sliding_window is not applied: every layer attends to the whole "
                        "context, as llama.cpp (its Phi SWA is disabled)", path, arch)
        if spec.scales is Scales.SQRT_EMBD:
            kw.update(embd_scale=math.sqrt(v["n_embd"]))
        if spec.scales is Scales.GRANITE:
            _granite_scales(v, arch, path, kw)
        attn_scale = 1.0 / math.sqrt(v["head_dim_k"])
        if spec.attn.scale_key:
            attn_scale = v["attn_scale"] or attn_scale
        n_ff_shared = n_dense_lead = 0
        if spec.moe is not None:
            n_ff_expert = v["n_ff_expert"] or v["n_ff"]
            if spec.moe.shared is SharedExpert.COUNT:   # llama.cpp: n_ff_exp * expert_shared_count
                n_ff_shared = n_ff_expert * v["n_shared_experts"]
            else:
                n_ff_shared = v["n_ff_shared"] or 0
            n_dense_lead = v["n_dense_lead"] or 0
            kw.update(n_expert=v["n_expert"], n_expert_used=v["n_expert_used"], n_ff_expert=n_ff_expert,
                      n_ff_shared=n_ff_shared, expert_weights_norm=bool(v["expert_weights_norm"]),
                      n_dense_lead=n_dense_lead)
        if sigmoid:
            _sigmoid_gating(v, arch, path)
        recurrent = None
        if spec.layers.delta_net is not DeltaNet.NONE:
            kw.update(_linear_attention(v, arch, path, sectioned=spec.rope.kind is RopeKind.IMROPE))
            recurrent = _recurrent_layers(v["recurrent_layers"], arch, path, n_blocks)
        n_layer = n_blocks - n_nextn
        layers = layer_specs(spec, n_layer, sliding_window=window, full_attention_interval=v["full_attention_interval"],
                             recurrent_layers=recurrent, shared_expert=n_ff_shared > 0, n_dense_lead=n_dense_lead)
        return ModelConfig(
            arch=arch, spec=spec, n_layer=n_layer, n_embd=v["n_embd"], n_head=v["n_head"], n_head_kv=v["n_head_kv"],
            head_dim_k=v["head_dim_k"], head_dim_v=v["head_dim_v"], n_ff=v["n_ff"] or 0, n_ctx_train=v["n_ctx_train"],
            norm_eps=v["norm_eps"], rope_dims=v["rope_dims"], rope_base=v["rope_base"], attn_scale=attn_scale,
            vocab_size=v["vocab_size"], layers=layers, n_layer_nextn=n_nextn, **kw)


ROPE_SCALING_TYPES = ("none", "linear", "yarn")
GATING_SIGMOID = 2   # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID ({arch}.expert_gating_func)


def _sigmoid_gating(v: dict, arch: str, path: str) -> None:
    """glm4moe's gating as llama.cpp reads it: expert_gating_func absent (0) means sigmoid, any
    other than sigmoid is refused; multi-section RoPE (a vision model's) is refused too."""
    func = v["expert_gating_func"] or 0
    if func not in (0, GATING_SIGMOID):
        raise ConfigMissing(f"{path}: {arch}.expert_gating_func={func} is not supported (only {GATING_SIGMOID}: sigmoid)")
    sections = v["rope_sections"]
    if sections is not None and any(int(s) for s in sections):
        raise ConfigMissing(f"{path}: {arch}.rope.dimension_sections={list(sections)} (multi-section RoPE of a vision "
                            f"model) is not supported")


def _granite_scales(v: dict, arch: str, path: str, kw: dict) -> None:
    """granite's multipliers as llama.cpp reads them (0 or absent: not applied; logit_scale
    required) into kw. A file that turns RoPE off (rope.scaling.finetuned false) is refused."""
    if v["rope_finetuned"] is False:
        raise ConfigMissing(f"{path}: {arch}.rope.scaling.finetuned=false (attention without RoPE) is not supported")
    kw.update(residual_scale=v["residual_scale"], logit_scale=v["logit_scale"],
              **({"embd_scale": v["embd_scale"]} if v["embd_scale"] else {}))
    if kw["logit_scale"] == 0:
        raise ConfigMissing(f"{path}: {arch}.logit_scale is 0 (the logits are divided by it)")


def _rope_scaling(v: dict, arch: str, spec: ArchSpec, path: str) -> dict:
    """RoPE scaling as llama.cpp reads it (the type defaults to linear; freq_scale = 1 / factor
    unless the type is none) and, for YaRN, the context's ext_factor 1 and its original context
    (LongRoPE's too). attn_factor is the context's: rope.scaling.attn_factor (default 1), for YaRN
    times get_mscale(factor) / (1 + 0.1 ln factor) (llama.cpp cancels here the magnitude its rope
    kernel applies), in float32 as there. With spec.rope.yarn_betas the file's YaRN betas, with
    spec.attn.temperature the queries' temperature and its floor scale (mistral3)."""
    kind = v["rope_scaling"]
    if kind not in ROPE_SCALING_TYPES:
        raise ConfigMissing(f"{path}: {arch}.rope.scaling.type={kind!r} is not supported "
                            f"(supported: {', '.join(ROPE_SCALING_TYPES)})")
    factor = v["rope_factor"] or v["rope_scale_linear"]
    freq_scale = 1.0 / factor if factor and kind != "none" else 1.0
    n_ctx_orig = v["n_ctx_orig"] if v["n_ctx_orig"] is not None else v["n_ctx_train"]
    f32 = np.float32
    attn_factor = f32(1.0)
    out = dict(rope_scale=freq_scale)
    if kind == "yarn":
        f = f32(1.0) / f32(freq_scale)
        mscale = f32(f32(0.1) * np.log(f) + f32(1.0)) if f > 1 else f32(1.0)
        attn_factor = f32(mscale * f32(f32(1.0) / f32(f32(1.0) + f32(0.1) * np.log(f))))
        out.update(rope_ext_factor=1.0, n_ctx_orig_yarn=n_ctx_orig)
    if spec.rope.long_rope:   # llama.cpp's n_ctx_orig_yarn, which picks the long or the short factors
        out.update(n_ctx_orig_yarn=n_ctx_orig)
    out["rope_attn_factor"] = float(f32(attn_factor * f32(v["rope_attn_factor"])))
    if spec.rope.yarn_betas:
        out.update(yarn_beta_fast=v["yarn_beta_fast"], yarn_beta_slow=v["yarn_beta_slow"])
    if spec.attn.temperature and (temp := v["attn_temp_scale"]):
        floor = v["n_ctx_orig"] or 0
        if floor <= 0:
            raise ConfigMissing(f"{path}: {arch}.attention.temperature_scale={temp} needs "
                                f"{arch}.rope.scaling.original_context_length (its floor scale) above 0")
        out.update(attn_temp_scale=temp, attn_temp_floor=floor)
    return out


def _linear_attention(v: dict, arch: str, path: str, sectioned: bool) -> dict:
    """The Gated DeltaNet sizes and (`sectioned`: qwen35's) the multi-section RoPE, checked for
    consistency."""
    head_k, head_v = v["head_dim_k"], v["head_dim_v"]
    conv, d_state = v["ssm_conv_kernel"], v["ssm_head_dim"]
    k_heads, v_heads, d_inner = v["ssm_k_heads"], v["ssm_v_heads"], v["ssm_inner_size"]
    problems = []
    if head_k != head_v:
        problems.append(f"attention.key_length {head_k} != attention.value_length {head_v}")
    if d_inner != v_heads * d_state:
        problems.append(f"ssm.inner_size {d_inner} != ssm.time_step_rank {v_heads} x ssm.state_size {d_state}")
    if k_heads <= 0 or v_heads % k_heads:
        problems.append(f"ssm.time_step_rank {v_heads} is not a multiple of ssm.group_count {k_heads}")
    if conv < 2:
        problems.append(f"ssm.conv_kernel {conv} must be at least 2")
    sections = v["rope_sections"] if sectioned else ()
    if sectioned and (not isinstance(sections, (list, tuple)) or not 1 <= len(sections) <= 4 or sum(sections) <= 0):
        problems.append(f"rope.dimension_sections {sections!r} should be up to 4 section sizes")
        sections = ()
    if problems:
        raise ConfigMissing(f"{path}: {arch} metadata is inconsistent: " + "; ".join(problems))
    sections = tuple(int(s) for s in sections) + (0,) * (4 - len(sections)) if sectioned else ()
    return dict(ssm_conv_kernel=conv, ssm_head_dim=d_state, ssm_k_heads=k_heads, ssm_v_heads=v_heads,
                rope_sections=sections)


def _recurrent_layers(value, arch: str, path: str, n_blocks: int) -> tuple[bool, ...] | None:
    """{arch}.attention.recurrent_layers, when the file says per layer which ones are DeltaNet."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) < n_blocks:
        raise ConfigMissing(f"{path}: {arch}.attention.recurrent_layers should hold {n_blocks} flags, got {value!r}")
    return tuple(bool(v) for v in value)
