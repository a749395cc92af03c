"""ModelConfig: the hyper-parameters of a GGUF model, read once from its metadata keys."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import VkrtError


class ConfigMissing(VkrtError):
    """A metadata key the architecture needs is absent or has the wrong type."""


ROPE_NORMAL, ROPE_NEOX = "normal", "neox"

# architecture -> (rope mode, has attention biases, QK-norm, MoE)
ARCHITECTURES = {
    "llama": (ROPE_NORMAL, False, False, False),
    "qwen2": (ROPE_NEOX, True, False, False),
    "qwen3": (ROPE_NEOX, False, True, False),
    "qwen2moe": (ROPE_NEOX, True, False, True),
    "qwen3moe": (ROPE_NEOX, False, True, True),
    "gemma3": (ROPE_NEOX, False, True, False),
}


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
    rope_scale: float              # freq_scale (1 / linear scaling factor)
    attn_bias: bool
    qk_norm: bool
    attn_scale: float
    vocab_size: int
    # gemma3
    embd_scale: float = 1.0
    sliding_window: int = 0        # 0: every layer attends to everything
    swa_layers: tuple[bool, ...] = ()
    rope_base_swa: float = 0.0
    post_norms: bool = False       # post_attention_norm / post_ffw_norm
    activation: str = "silu"
    # mixture of experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    n_ff_shared: int = 0
    expert_weights_norm: bool = False
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def moe(self) -> bool:
        return self.n_expert > 0

    def layer_is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def layer_rope_base(self, il: int) -> float:
        return self.rope_base_swa if self.layer_is_swa(il) and self.rope_base_swa else self.rope_base

    @staticmethod
    def from_metadata(meta: dict, path: str = "model") -> "ModelConfig":
        arch = meta.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise ConfigMissing(f"{path}: general.architecture={arch!r} is not supported "
                                f"(supported: {', '.join(sorted(ARCHITECTURES))})")
        rope_mode, bias, qk_norm, moe = ARCHITECTURES[arch]

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

        n_embd = int(get("embedding_length"))
        n_head = int(get("attention.head_count"))
        n_head_kv = int(get("attention.head_count_kv", n_head))
        head_k = int(get("attention.key_length", n_embd // n_head))
        head_v = int(get("attention.value_length", head_k))
        n_layer = int(get("block_count"))
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = int(get("vocab_size", len(tokens) if tokens is not None else None))
        scaling = meta.get(f"{arch}.rope.scaling.type")
        factor = get("rope.scaling.factor", None, required=False)
        rope_scale = 1.0 / factor if scaling == "linear" and factor else 1.0
        kw: dict = {}
        if arch == "gemma3":
            window = int(get("attention.sliding_window", 0, required=False) or 0)
            pattern = 6  # llama.cpp: every 6th layer attends globally, the others use the window
            kw = dict(embd_scale=math.sqrt(n_embd), sliding_window=window, post_norms=True, activation="gelu",
                      swa_layers=tuple((il + 1) % pattern != 0 for il in range(n_layer)) if window else (),
                      rope_base_swa=10000.0)
        if moe:
            kw.update(n_expert=int(get("expert_count")), n_expert_used=int(get("expert_used_count")),
                      n_ff_expert=int(get("expert_feed_forward_length")),
                      n_ff_shared=int(get("expert_shared_feed_forward_length", 0, required=False) or 0),
                      expert_weights_norm=bool(meta.get(f"{arch}.expert_weights_norm", arch == "qwen3moe")))
        return ModelConfig(
            arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim_k=head_k,
            head_dim_v=head_v, n_ff=int(get("feed_forward_length", 0, required=not moe) or 0),
            n_ctx_train=int(get("context_length", 4096, required=False)),
            norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6, required=False)),
            rope_mode=rope_mode, rope_dims=int(get("rope.dimension_count", head_k, required=False)),
            rope_base=float(get("rope.freq_base", 10000.0, required=False)), rope_scale=rope_scale,
            attn_bias=bias, qk_norm=qk_norm, attn_scale=1.0 / math.sqrt(head_k), vocab_size=vocab, **kw)
