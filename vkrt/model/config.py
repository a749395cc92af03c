"""ModelConfig: the hyper-parameters of a GGUF model, read once from its metadata keys, with the
architecture's spec (arch.py) and one LayerSpec per layer."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import VkrtError
from .arch import (ARCHS, LINEAR, ROPE_IMROPE, ROPE_NEOX, ROPE_NORMAL, SLIDING, ArchSpec,  # noqa: F401
                   LayerSpec, layer_specs)

log = logging.getLogger("vkrt")


class ConfigMissing(VkrtError):
    """A metadata key the architecture needs is absent or has the wrong type."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_ctx_train: int
    norm_eps: float
    rope_mode: str
    rope_dims: int
    rope_base: float
    rope_scale: float              # freq_scale (1 / the rope.scaling.factor)
    attn_bias: bool
    qk_norm: bool
    attn_scale: float
    vocab_size: int
    layers: tuple[LayerSpec, ...] = ()
    spec: ArchSpec | None = field(default=None, compare=False, repr=False)
    # ggml_rope_ext's attn_factor, and YaRN's (rope.scaling.type yarn) ext_factor and n_ctx_orig
    rope_attn_factor: float = 1.0
    rope_ext_factor: float = 0.0
    n_ctx_orig_yarn: int = 0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    # mistral3: the queries' temperature (attention.temperature_scale; 0: none) and its floor scale
    attn_temp_scale: float = 0.0
    attn_temp_floor: int = 0
    # gpt-oss: attention output bias and sinks; router bias, expert biases, softmax of the chosen
    attn_out_bias: bool = False
    attn_sinks: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    chosen_softmax: bool = False
    qk_norm_full: bool = False     # olmoe: q/k norms over each token's whole q and k
    # gemma3 (sqrt(n_embd)), granite ({arch}.embedding_scale)
    embd_scale: float = 1.0
    # granite: each block's output times residual_scale before the residual add (0: none); the
    # logits divided by logit_scale
    residual_scale: float = 0.0
    logit_scale: float = 1.0
    sliding_window: int = 0        # 0: every layer attends to everything
    rope_base_swa: float = 0.0
    rope_scale_swa: float = 0.0    # 0: rope_scale
    post_norms: bool = False       # post_attention_norm / post_ffw_norm
    activation: str = "silu"
    # mixture of experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    n_ff_shared: int = 0
    shared_gate: bool = True       # the shared expert's output times sigmoid(ffn_gate_inp_shexp·x)
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0   # the routing weights times it (0 or 1: not scaled; glm4moe)
    sigmoid_router: bool = False        # glm4moe's gating (arch.py), its selection bias exp_probs_b
    # qwen35: gated attention, multi-section RoPE, Gated DeltaNet layers
    attn_gate: bool = False
    rope_sections: tuple[int, ...] = ()
    ssm_conv_kernel: int = 0       # causal conv window (4)
    ssm_head_dim: int = 0          # q/k/v head size of the DeltaNet layers (ssm.state_size)
    ssm_k_heads: int = 0           # query/key heads (ssm.group_count)
    ssm_v_heads: int = 0           # value heads (ssm.time_step_rank)
    n_layer_nextn: int = 0         # multi-token-prediction blocks after the trunk (not run)
    # qwen3next files: the DeltaNet input projection is one ssm_in (q, k, v, z grouped by key head;
    # the converters before attn_qkv / attn_gate): set from the file's tensors (tensors.file_layout)
    qkvz_fused: bool = False
    # phi3: attention's projections are one attn_qkv in the file (tensors.file_layout); ffn_up holds
    # gate and up; LongRoPE factors chosen by the context against n_ctx_orig_yarn (transformer.py)
    qkv_fused: bool = False
    gate_up_fused: bool = False
    long_rope: bool = False
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def moe(self) -> bool:
        return any(layer.moe for layer in self.layers)

    @property
    def ffn_norm(self) -> str:
        return self.spec.ffn_norm if self.spec is not None else "ffn_norm"

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
        return 4 if self.rope_mode == ROPE_IMROPE else 1

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
        return self.rope_scale_swa if self.layer_is_swa(il) and self.rope_scale_swa else self.rope_scale

    @staticmethod
    def from_metadata(meta: dict, path: str = "model") -> "ModelConfig":
        arch = meta.get("general.architecture")
        if arch not in ARCHS:
            raise ConfigMissing(f"{path}: general.architecture={arch!r} is not supported "
                                f"(supported: {', '.join(sorted(ARCHS))})")
        spec = ARCHS[arch]

        def get(key, default=None, required=True, kind=(int, float)):
            full = f"{arch}.{key}"
            value = meta.get(full, default)
            if value is None:
                if required:
                    raise ConfigMissing(f"{path}: metadata key {full} is missing")
                return None
            if isinstance(value, (list, tuple)):  # per-layer arrays: all equal in what we support
                value = value[0]
            if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
                raise ConfigMissing(f"{path}: {full} should be a number, got {value!r}")
            return value

        if spec.moe_optional and (get("expert_count", 0, required=False) or 0) > 0:
            spec = replace(spec, moe=True, expert_weights_norm=True)
        n_embd = int(get("embedding_length"))
        n_head = int(get("attention.head_count"))
        n_head_kv = int(get("attention.head_count_kv", n_head))
        head_k = int(get("attention.key_length", n_embd // n_head))
        head_v = int(get("attention.value_length", head_k))
        n_blocks = int(get("block_count"))
        n_nextn = int(get("nextn_predict_layers", 0, required=False) or 0)
        if not 0 <= n_nextn < n_blocks:
            raise ConfigMissing(f"{path}: {arch}.nextn_predict_layers={n_nextn} must be below block_count={n_blocks}")
        n_layer = n_blocks - n_nextn
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = int(get("vocab_size", len(tokens) if tokens is not None else None))
        scale_w = get("expert_weights_scale", 0.0, required=False)
        if scale_w not in (0, 0.0, 1, 1.0) and not spec.sigmoid_router:
            raise ConfigMissing(f"{path}: {arch}.expert_weights_scale={scale_w} is not supported (only 0 or 1)")
        n_ctx_train = int(get("context_length", 4096, required=False))
        rope_base = float(get("rope.freq_base", 10000.0, required=False))
        kw: dict = dict(spec=spec, attn_gate=spec.attn_gate, post_norms=spec.post_norms, activation=spec.activation,
                        attn_out_bias=spec.attn_out_bias, attn_sinks=spec.attn_sinks, router_bias=spec.router_bias,
                        expert_bias=spec.expert_bias, chosen_softmax=spec.chosen_softmax,
                        qk_norm_full=spec.qk_norm_full, shared_gate=spec.shared_gate,
                        sigmoid_router=spec.sigmoid_router, expert_weights_scale=float(scale_w),
                        gate_up_fused=spec.gate_up_fused,
                        **_rope_scaling(meta, arch, spec, path, get, n_ctx_train))
        window = 0
        if spec.swa_pattern:
            window = int(get("attention.sliding_window", None, required=spec.swa_required) or 0)
            kw.update(sliding_window=window, rope_scale_swa=spec.rope_scale_swa,
                      rope_base_swa=float(get("rope.freq_base_swa", spec.rope_base_swa or rope_base, required=False)))
        if spec.swa_disabled and (get("attention.sliding_window", 0, required=False) or 0) > 0:
            log.warning("%s: %s.attention.sliding_window is not applied: every layer attends to the whole "
                        "context, as llama.cpp (its Phi SWA is disabled)", path, arch)
        if spec.long_rope:   # llama.cpp's n_ctx_orig_yarn, which picks the long or the short factors
            kw.update(long_rope=True, n_ctx_orig_yarn=int(get("rope.scaling.original_context_length", n_ctx_train,
                                                               required=False)))
        if spec.embd_scale_sqrt:
            kw.update(embd_scale=math.sqrt(n_embd))
        attn_scale = 1.0 / math.sqrt(head_k)
        if spec.attn_scale_key:
            attn_scale = float(get("attention.scale", 0.0, required=False) or 0.0) or attn_scale
        if spec.granite_scales:
            attn_scale = _granite_scales(meta, arch, path, get, kw) or attn_scale
        n_ff_shared = n_dense_lead = 0
        if spec.moe:
            n_ff_expert = int(get("expert_feed_forward_length", None, required=not spec.ff_is_expert_ff)
                              or get("feed_forward_length"))
            if spec.shared_expert == "count":   # llama.cpp: n_ff_exp * expert_shared_count
                n_ff_shared = n_ff_expert * int(get("expert_shared_count"))
            else:
                n_ff_shared = int(get("expert_shared_feed_forward_length", 0, required=spec.shared_expert == "always")
                                  or 0)
            kw.update(n_expert=int(get("expert_count")), n_expert_used=int(get("expert_used_count")),
                      n_ff_expert=n_ff_expert, n_ff_shared=n_ff_shared,
                      expert_weights_norm=bool(meta.get(f"{arch}.expert_weights_norm", spec.expert_weights_norm)))
        if spec.dense_lead:
            n_dense_lead = int(get("leading_dense_block_count", 0, required=False) or 0)
        if spec.sigmoid_router:
            _sigmoid_gating(meta, arch, path, get)
        recurrent = None
        if spec.hybrid_linear:
            kw.update(_linear_attention(meta, arch, path, get, head_k, head_v, sectioned=spec.rope == ROPE_IMROPE))
            recurrent = _recurrent_layers(meta, arch, path, n_blocks)
        layers = layer_specs(spec, n_layer, sliding_window=window,
                             full_attention_interval=int(get("full_attention_interval", 4, required=False)),
                             recurrent_layers=recurrent, shared_expert=n_ff_shared > 0, n_dense_lead=n_dense_lead)
        return ModelConfig(
            arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim_k=head_k,
            head_dim_v=head_v, n_ff=int(get("feed_forward_length", 0, required=not spec.moe or n_dense_lead > 0) or 0),
            n_ctx_train=n_ctx_train, norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6, required=False)),
            rope_mode=spec.rope, rope_dims=int(get("rope.dimension_count", head_k, required=False)),
            rope_base=rope_base,
            attn_bias=spec.attn_bias, qk_norm=spec.qk_norm, attn_scale=attn_scale, vocab_size=vocab,
            layers=layers, n_layer_nextn=n_nextn, **kw)


ROPE_SCALING_TYPES = ("none", "linear", "yarn")
GATING_SIGMOID = 2   # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID ({arch}.expert_gating_func)


def _sigmoid_gating(meta: dict, arch: str, path: str, get) -> None:
    """glm4moe's gating as llama.cpp reads it: expert_gating_func absent (0) means sigmoid, any
    other than sigmoid is refused; multi-section RoPE (a vision model's) is refused too."""
    func = int(get("expert_gating_func", 0, required=False) or 0)
    if func not in (0, GATING_SIGMOID):
        raise ConfigMissing(f"{path}: {arch}.expert_gating_func={func} is not supported (only {GATING_SIGMOID}: sigmoid)")
    sections = meta.get(f"{arch}.rope.dimension_sections")
    if sections is not None and any(int(s) for s in sections):
        raise ConfigMissing(f"{path}: {arch}.rope.dimension_sections={list(sections)} (multi-section RoPE of a vision "
                            f"model) is not supported")


def _granite_scales(meta: dict, arch: str, path: str, get, kw: dict) -> float:
    """granite's multipliers as llama.cpp reads them (0 or absent: not applied; logit_scale
    required) into kw; returns attention.scale (0: 1/sqrt(d)). A file that turns RoPE off
    (rope.scaling.finetuned false) is refused."""
    if meta.get(f"{arch}.rope.scaling.finetuned", True) is False:
        raise ConfigMissing(f"{path}: {arch}.rope.scaling.finetuned=false (attention without RoPE) is not supported")
    embd = float(get("embedding_scale", 0.0, required=False))
    kw.update(residual_scale=float(get("residual_scale", 0.0, required=False)),
              logit_scale=float(get("logit_scale")), **({"embd_scale": embd} if embd else {}))
    if kw["logit_scale"] == 0:
        raise ConfigMissing(f"{path}: {arch}.logit_scale is 0 (the logits are divided by it)")
    return float(get("attention.scale", 0.0, required=False))


def _rope_scaling(meta: dict, arch: str, spec: ArchSpec, path: str, get, n_ctx_train: int) -> dict:
    """RoPE scaling as llama.cpp reads it (the type defaults to linear; freq_scale = 1 / factor
    unless the type is none) and, for YaRN, the context's ext_factor 1 and its original context.
    attn_factor is the context's: rope.scaling.attn_factor (default 1), for YaRN times
    get_mscale(factor) / (1 + 0.1 ln factor) (llama.cpp cancels here the magnitude its rope
    kernel applies), in float32 as there. With spec.yarn_betas the file's YaRN betas, with
    spec.attn_temperature the queries' temperature and its floor scale (mistral3)."""
    kind = meta.get(f"{arch}.rope.scaling.type", "linear")
    if kind not in ROPE_SCALING_TYPES:
        raise ConfigMissing(f"{path}: {arch}.rope.scaling.type={kind!r} is not supported "
                            f"(supported: {', '.join(ROPE_SCALING_TYPES)})")
    factor = get("rope.scaling.factor", None, required=False) or get("rope.scale_linear", None, required=False)
    freq_scale = 1.0 / factor if factor and kind != "none" else 1.0
    f32 = np.float32
    attn_factor = f32(1.0)
    out = dict(rope_scale=freq_scale)
    if kind == "yarn":
        f = f32(1.0) / f32(freq_scale)
        mscale = f32(f32(0.1) * np.log(f) + f32(1.0)) if f > 1 else f32(1.0)
        attn_factor = f32(mscale * f32(f32(1.0) / f32(f32(1.0) + f32(0.1) * np.log(f))))
        out.update(rope_ext_factor=1.0,
                   n_ctx_orig_yarn=int(get("rope.scaling.original_context_length", n_ctx_train, required=False)))
    out["rope_attn_factor"] = float(f32(attn_factor * f32(get("rope.scaling.attn_factor", 1.0, required=False))))
    if spec.yarn_betas:
        out.update(yarn_beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0, required=False)),
                   yarn_beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0, required=False)))
    if spec.attn_temperature and (temp := float(get("attention.temperature_scale", 0.0, required=False) or 0.0)):
        floor = int(get("rope.scaling.original_context_length", 0, required=False) or 0)
        if floor <= 0:
            raise ConfigMissing(f"{path}: {arch}.attention.temperature_scale={temp} needs "
                                f"{arch}.rope.scaling.original_context_length (its floor scale) above 0")
        out.update(attn_temp_scale=temp, attn_temp_floor=floor)
    return out


def _linear_attention(meta: dict, arch: str, path: str, get, head_k: int, head_v: int, sectioned: bool) -> dict:
    """The Gated DeltaNet sizes and (`sectioned`: qwen35's) the multi-section RoPE, checked for
    consistency."""
    conv, d_state = int(get("ssm.conv_kernel")), int(get("ssm.state_size"))
    k_heads, v_heads, d_inner = int(get("ssm.group_count")), int(get("ssm.time_step_rank")), int(get("ssm.inner_size"))
    problems = []
    if head_k != head_v:
        problems.append(f"attention.key_length {head_k} != attention.value_length {head_v}")
    if d_inner != v_heads * d_state:
        problems.append(f"ssm.inner_size {d_inner} != ssm.time_step_rank {v_heads} x ssm.state_size {d_state}")
    if k_heads <= 0 or v_heads % k_heads:
        problems.append(f"ssm.time_step_rank {v_heads} is not a multiple of ssm.group_count {k_heads}")
    if conv < 2:
        problems.append(f"ssm.conv_kernel {conv} must be at least 2")
    sections = meta.get(f"{arch}.rope.dimension_sections") if sectioned else ()
    if sectioned and (not isinstance(sections, (list, tuple)) or not 1 <= len(sections) <= 4 or sum(sections) <= 0):
        problems.append(f"rope.dimension_sections {sections!r} should be up to 4 section sizes")
        sections = ()
    if problems:
        raise ConfigMissing(f"{path}: {arch} metadata is inconsistent: " + "; ".join(problems))
    sections = tuple(int(s) for s in sections) + (0,) * (4 - len(sections)) if sectioned else ()
    return dict(ssm_conv_kernel=conv, ssm_head_dim=d_state, ssm_k_heads=k_heads, ssm_v_heads=v_heads,
                rope_sections=sections)


def _recurrent_layers(meta: dict, arch: str, path: str, n_blocks: int) -> tuple[bool, ...] | None:
    """{arch}.attention.recurrent_layers, when the file says per layer which ones are DeltaNet."""
    value = meta.get(f"{arch}.attention.recurrent_layers")
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) < n_blocks:
        raise ConfigMissing(f"{path}: {arch}.attention.recurrent_layers should hold {n_blocks} flags, got {value!r}")
    return tuple(bool(v) for v in value)
