"""The `{arch}.*` metadata keys of a GGUF model, each named once: `read_keys` gathers them for
ModelConfig.from_metadata, `write_keys` writes them for the synthetic generator, both walking
KEYS in order (the order a synthetic file holds them).

A key's `used` says which files have it (by their architecture's spec and the values before it);
absent, it takes its default (a value, or a function of the spec and the values before it) and,
where that is None too and the key is `required`, the file is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gguf import GGUFValueType

from ..errors import VkrtError
from .arch import ArchSpec, DeltaNet, RopeKind, Router, Scales, SharedExpert, Window, experts_of


class ConfigMissing(VkrtError):
    """A metadata key the architecture needs is absent or has the wrong type."""


Rule = Callable[[ArchSpec, dict], object]   # (the architecture's spec, the values before the key) -> ...


def _always(s: ArchSpec, v: dict) -> bool:
    return True


def _experts(s: ArchSpec, v: dict) -> bool:
    return experts_of(s, v.get("n_expert")) is not None


def _router(router: Router) -> Rule:
    return lambda s, v: _experts(s, v) and s.moe.router is router


def _granite(s: ArchSpec, v: dict) -> bool:
    return s.scales is Scales.GRANITE


def _delta_net(s: ArchSpec, v: dict) -> bool:
    return s.layers.delta_net is not DeltaNet.NONE


@dataclass(frozen=True)
class Key:
    """`{arch}.<name>`, gathered under `field` (a ModelConfig field where the config holds it as
    read). `type`: int or float (numbers: a bool is refused, a per-layer array gives its first
    value), or bool, str, list (taken as they are); it also picks the GGUF type written.
    `written_under`: for a file of the given spec, the field of the Key whose name this value is
    written under, in this key's place (None: its own name)."""

    name: str
    field: str
    type: type = int
    default: object = None
    required: bool | Rule = False
    used: Rule = _always
    written_under: Callable[[ArchSpec], str | None] = lambda spec: None


KEYS = (
    Key("context_length", "n_ctx_train", default=4096),
    Key("embedding_length", "n_embd", required=True),
    Key("block_count", "n_blocks", required=True),
    Key("attention.head_count", "n_head", required=True),
    Key("attention.head_count_kv", "n_head_kv", default=lambda s, v: v["n_head"]),
    Key("attention.key_length", "head_dim_k", default=lambda s, v: v["n_embd"] // v["n_head"]),
    Key("attention.value_length", "head_dim_v", default=lambda s, v: v["head_dim_k"]),
    Key("rope.dimension_count", "rope_dims", default=lambda s, v: v["head_dim_k"]),
    Key("rope.freq_base", "rope_base", float, 10000.0),
    Key("attention.layer_norm_rms_epsilon", "norm_eps", float, 1e-6),
    Key("vocab_size", "vocab_size", default=lambda s, v: v["n_tokens"], required=True),
    # routed experts (llama, mistral3: where the file counts them)
    Key("expert_count", "n_expert", required=lambda s, v: not s.moe.optional, used=lambda s, v: s.moe is not None),
    Key("expert_used_count", "n_expert_used", required=True, used=_experts),
    # the experts' size; ff_is_expert_ff files (Mixtral-style, OLMoE, Granite MoE) keep it in the
    # dense FFNs' feed_forward_length (read below where this one is absent, written here)
    Key("expert_feed_forward_length", "n_ff_expert", required=lambda s, v: not s.moe.ff_is_expert_ff, used=_experts,
        written_under=lambda s: "n_ff" if s.moe.ff_is_expert_ff else None),
    Key("expert_shared_count", "n_shared_experts", required=True,
        used=lambda s, v: _experts(s, v) and s.moe.shared is SharedExpert.COUNT),
    Key("expert_shared_feed_forward_length", "n_ff_shared", required=lambda s, v: s.moe.shared is SharedExpert.ALWAYS,
        used=lambda s, v: _experts(s, v) and s.moe.shared is not SharedExpert.COUNT),
    Key("expert_gating_func", "expert_gating_func", default=0, used=_router(Router.SIGMOID)),
    Key("expert_weights_norm", "expert_weights_norm", bool, default=lambda s, v: s.moe.weights_norm, used=_experts),
    Key("expert_weights_scale", "expert_weights_scale", float, 0.0),
    Key("leading_dense_block_count", "n_dense_lead", default=0, used=lambda s, v: _experts(s, v) and s.moe.dense_lead),
    # the dense FFNs' size; with ff_is_expert_ff (or an expert_feed_forward_length of 0) the experts'
    Key("feed_forward_length", "n_ff", required=lambda s, v: _experts(s, v) and not v["n_ff_expert"]),
    Key("attention.sliding_window", "sliding_window", required=lambda s, v: s.layers.window is Window.REQUIRED,
        used=lambda s, v: s.layers.window is not Window.IGNORED),
    Key("embedding_scale", "embd_scale", float, 0.0, used=_granite),
    Key("residual_scale", "residual_scale", float, 0.0, used=_granite),
    Key("attention.scale", "attn_scale", float, 0.0, used=lambda s, v: s.attn.scale_key),
    Key("logit_scale", "logit_scale", float, required=True, used=_granite),
    Key("rope.scaling.type", "rope_scaling", str, "linear"),
    Key("rope.scaling.factor", "rope_factor", float),
    Key("rope.scaling.original_context_length", "n_ctx_orig",
        used=lambda s, v: v["rope_scaling"] == "yarn" or s.rope.long_rope or s.attn.temperature),
    Key("rope.scaling.attn_factor", "rope_attn_factor", float, 1.0),
    Key("ssm.conv_kernel", "ssm_conv_kernel", required=True, used=_delta_net),
    Key("ssm.state_size", "ssm_head_dim", required=True, used=_delta_net),
    Key("ssm.group_count", "ssm_k_heads", required=True, used=_delta_net),
    Key("ssm.time_step_rank", "ssm_v_heads", required=True, used=_delta_net),
    Key("ssm.inner_size", "ssm_inner_size", required=True, used=_delta_net),
    Key("full_attention_interval", "full_attention_interval", default=4),
    # qwen35's sections; glm4moe refuses a vision model's
    Key("rope.dimension_sections", "rope_sections", list,
        used=lambda s, v: s.rope.kind is RopeKind.IMROPE or _router(Router.SIGMOID)(s, v)),
    # read, not written by the synthetic generator (its `extra` keys may hold them)
    Key("nextn_predict_layers", "n_layer_nextn", default=0),
    Key("rope.scale_linear", "rope_scale_linear", float),
    Key("rope.freq_base_swa", "rope_base_swa", float, default=lambda s, v: s.rope.swa_base or v["rope_base"],
        used=lambda s, v: s.layers.swa_pattern > 0),
    Key("rope.scaling.yarn_beta_fast", "yarn_beta_fast", float, 32.0, used=lambda s, v: s.rope.yarn_betas),
    Key("rope.scaling.yarn_beta_slow", "yarn_beta_slow", float, 1.0, used=lambda s, v: s.rope.yarn_betas),
    Key("attention.temperature_scale", "attn_temp_scale", float, 0.0, used=lambda s, v: s.attn.temperature),
    Key("rope.scaling.finetuned", "rope_finetuned", bool, True, used=_granite),
    Key("attention.recurrent_layers", "recurrent_layers", list, used=_delta_net),
)
_BY_FIELD = {key.field: key for key in KEYS}
_GGUF_TYPES = {int: GGUFValueType.UINT32, float: GGUFValueType.FLOAT32, bool: GGUFValueType.BOOL,
               str: GGUFValueType.STRING, list: GGUFValueType.ARRAY}


def _call(rule, spec: ArchSpec, values: dict):
    return rule(spec, values) if callable(rule) else rule


def read_keys(meta: dict, arch: str, spec: ArchSpec, path: str, n_tokens: int | None) -> dict:
    """field -> value of every key of KEYS (None where the file lacks one it may lack, or where
    its architecture does not read it); `n_tokens`: the tokenizer's vocabulary, vocab_size's
    default. Raises ConfigMissing naming the first key that is missing or not a number."""
    values: dict = {"n_tokens": n_tokens}
    for key in KEYS:
        if not key.used(spec, values):
            values[key.field] = None
            continue
        full = f"{arch}.{key.name}"
        value = meta.get(full)
        if value is None:
            value = _call(key.default, spec, values)
        if value is None and _call(key.required, spec, values):
            raise ConfigMissing(f"{path}: metadata key {full} is missing")
        if value is not None and key.type in (int, float):
            if isinstance(value, (list, tuple)):   # per-layer arrays: all equal in what we support
                value = value[0]
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigMissing(f"{path}: {full} should be a number, got {value!r}")
            value = key.type(value)
        values[key.field] = value
    return values


def write_keys(writer, spec: ArchSpec, values: dict) -> None:
    """Write, in KEYS' order, every key whose field `values` sets (not None) and which a file of
    `spec` has, with the GGUF type of its Key (`writer`: a gguf.GGUFWriter)."""
    for key in KEYS:
        value = values.get(key.field)
        if value is not None and key.used(spec, values):
            name = _BY_FIELD[key.written_under(spec) or key.field].name
            writer.add_key_value(f"{writer.arch}.{name}", value, _GGUF_TYPES[key.type])
