"""Architectures as data: what each GGUF `general.architecture` means for the forward pass.

An `ArchSpec` holds the architecture-wide choices (RoPE kind, biases, norms, gates, MoE routing);
`layer_specs` turns a file's metadata into one `LayerSpec` per layer (which attention, which FFN).
Everything else -- the tensors a file must hold (tensors.py), the VRAM estimate, the synthetic
writer, the transformer's recording -- is derived from these two, so adding an architecture is
a row here plus whatever genuinely new ops it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

# attention kinds
FULL, SLIDING, LINEAR = "full", "sliding", "linear"
# FFN kinds
DENSE, MOE, MOE_SHARED = "dense", "moe", "moe_shared"
# RoPE kinds (llama.cpp's rope types)
ROPE_NORMAL, ROPE_NEOX, ROPE_IMROPE = "normal", "neox", "imrope"


@dataclass(frozen=True)
class LayerSpec:
    """One layer: `attn` FULL (attends to the whole context, KV cache), SLIDING (a window of
    the context, KV cache) or LINEAR (Gated DeltaNet: a recurrent state per sequence, no KV);
    `ffn` DENSE, MOE (routed experts) or MOE_SHARED (routed experts + a gated shared expert)."""

    attn: str
    ffn: str

    @property
    def has_kv(self) -> bool:
        return self.attn in (FULL, SLIDING)

    @property
    def moe(self) -> bool:
        return self.ffn in (MOE, MOE_SHARED)


@dataclass(frozen=True)
class ArchSpec:
    """Architecture-wide choices; `layers` (see layer_specs) says what each layer is."""

    name: str
    rope: str = ROPE_NEOX
    attn_bias: bool = False          # attn_{q,k,v}.bias (optional in the file unless biases_required)
    biases_required: bool = False    # every bias the architecture has must be in the file (gpt-oss)
    attn_out_bias: bool = False      # attn_output.bias
    attn_sinks: bool = False         # attn_sinks.weight: one softmax sink a query head (gpt-oss)
    qk_norm: bool = False            # attn_{q,k}_norm per head before RoPE
    qk_norm_full: bool = False       # attn_{q,k}_norm over each token's whole q and k vectors (olmoe)
    attn_gate: bool = False          # attn_q also yields a per-head output gate: o *= sigmoid(gate)
    post_norms: bool = False         # post_attention_norm / post_ffw_norm on each block's output (gemma3)
    ffn_norm: str = "ffn_norm"       # the norm before the FFN (qwen35: post_attention_norm)
    moe: bool = False                # FFNs are routed experts
    # routed experts when the file has {arch}.expert_count > 0 (Mixtral-style files stored as llama:
    # softmax routing, the chosen weights renormalised, as llama.cpp's llama graph)
    moe_optional: bool = False
    shared_expert: str = "no"        # "no", "optional" (by expert_shared_feed_forward_length), "always",
                                     # "count" (expert_shared_count experts of the routed ones' size: glm4moe)
    shared_gate: bool = True         # the shared expert's output times sigmoid(ffn_gate_inp_shexp·x)
    ff_is_expert_ff: bool = False    # the experts' FFN size is feed_forward_length (unless the file
                                     # has expert_feed_forward_length), as llama.cpp reads it
    expert_weights_norm: bool = False   # default of {arch}.expert_weights_norm
    chosen_softmax: bool = False     # experts weighted by the softmax of the chosen logits (gpt-oss)
    # sigmoid gating chosen by sigmoid + exp_probs_b (a selection bias an expert), weighed by the
    # sigmoid; {arch}.expert_weights_scale (any value) multiplies the weights (glm4moe)
    sigmoid_router: bool = False
    dense_lead: bool = False         # {arch}.leading_dense_block_count first layers have a dense FFN
    qk_norm_optional: bool = False   # per-head q/k norms where the file has them (glm4moe: GLM-4.5, 4.6)
    router_bias: bool = False        # ffn_gate_inp.bias
    expert_bias: bool = False        # ffn_{gate,up,down}_exps.bias: a bias per expert
    activation: str = "silu"         # the gated FFNs' (dense and experts): silu, gelu or swiglu_oai
    embd_scale_sqrt: bool = False    # x = token_embd[ids] * sqrt(n_embd) (gemma3)
    # granite's multipliers: {arch}.embedding_scale (x = token_embd[ids] * it), residual_scale (each
    # block's output times it before the residual add), attention.scale (replaces 1/sqrt(d)), all
    # optional, and logit_scale (logits divided by it; required)
    granite_scales: bool = False
    swa_pattern: int = 0             # with a sliding window: every Nth layer attends globally (gemma3: 6)
    swa_required: bool = False       # {arch}.attention.sliding_window must be in the file
    rope_base_swa: float = 0.0       # sliding layers' RoPE base unless the file says (0: rope.freq_base)
    rope_scale_swa: float = 0.0      # sliding layers' RoPE freq_scale (0: the file's, as full layers)
    output_required: bool = False    # output.weight must be in the file (llama.cpp: no fallback to token_embd)
    hybrid_linear: bool = False      # Gated DeltaNet layers between full attention ones (qwen35)
    # how the DeltaNet tensors lay out the heads: "tiled" (qwen35: attn_qkv / attn_gate, ssm_alpha /
    # ssm_beta; value head j reads key head j % n_k_heads) or "grouped" (qwen3next: ssm_in (q, k, v,
    # z) or attn_qkv / attn_gate, and ssm_ba (beta, alpha), grouped by key head; value head j reads
    # key head j // (n_v_heads / n_k_heads)); delta_net_layout.py turns grouped into tiled at load
    delta_net_layout: str = "tiled"
    # phi3: attention's q, k, v may be one attn_qkv (rows q, k, v; separate attn_q/k/v where the file
    # has them, as llama.cpp); ffn_up holds the gate's rows, then the up's (2 x feed_forward_length);
    # LongRoPE's rope_factors_long / _short, chosen by the context (tensors.py, transformer.py)
    qkv_fused_optional: bool = False
    gate_up_fused: bool = False
    long_rope: bool = False
    swa_disabled: bool = False       # attention.sliding_window is not applied, as llama.cpp (phi3: warned)
    # mistral3 (Ministral 3, Mistral Small 3.x text): the queries' temperature by position,
    # {arch}.attention.temperature_scale over rope.scaling.original_context_length (rope.glsl);
    # YaRN's rope.scaling.yarn_beta_fast / _slow read from the file (llama.cpp ignores them for
    # llama); {arch}.attention.scale replacing 1 / sqrt(head size) where set
    attn_temperature: bool = False
    yarn_betas: bool = False
    attn_scale_key: bool = False


ARCHS: dict[str, ArchSpec] = {s.name: s for s in (
    ArchSpec("llama", rope=ROPE_NORMAL, moe_optional=True, ff_is_expert_ff=True),
    ArchSpec("mistral3", rope=ROPE_NORMAL, moe_optional=True, ff_is_expert_ff=True, attn_temperature=True,
             yarn_betas=True, attn_scale_key=True),
    ArchSpec("qwen2", attn_bias=True),
    ArchSpec("qwen3", qk_norm=True),
    ArchSpec("gemma3", qk_norm=True, post_norms=True, activation="gelu", embd_scale_sqrt=True, swa_pattern=6,
             rope_base_swa=10000.0, rope_scale_swa=1.0),
    ArchSpec("qwen2moe", attn_bias=True, moe=True, shared_expert="optional"),
    ArchSpec("qwen3moe", qk_norm=True, moe=True, expert_weights_norm=True),
    ArchSpec("qwen35", rope=ROPE_IMROPE, qk_norm=True, attn_gate=True, ffn_norm="post_attention_norm",
             hybrid_linear=True),
    ArchSpec("qwen35moe", rope=ROPE_IMROPE, qk_norm=True, attn_gate=True, ffn_norm="post_attention_norm",
             moe=True, shared_expert="always", expert_weights_norm=True, hybrid_linear=True),
    # Qwen3-Next: qwen35moe's blocks with NEOX RoPE (rope.dimension_count of the head) and the
    # grouped DeltaNet layout
    ArchSpec("qwen3next", qk_norm=True, attn_gate=True, ffn_norm="post_attention_norm", moe=True,
             shared_expert="always", expert_weights_norm=True, hybrid_linear=True, delta_net_layout="grouped"),
    # GLM-4.5 / 4.6 (and -Air): attention biases, partial NEOX RoPE, optional q/k norms; leading
    # dense layers, then sigmoid-routed experts with a selection bias and an ungated shared expert
    ArchSpec("glm4moe", attn_bias=True, biases_required=True, qk_norm_optional=True, ffn_norm="post_attention_norm",
             moe=True, shared_expert="count", shared_gate=False, sigmoid_router=True, dense_lead=True),
    # gpt-oss: even layers attend to a sliding window (llama.cpp's set_swa_pattern(2)), YaRN from
    # the file's rope.scaling keys
    ArchSpec("gpt-oss", attn_bias=True, biases_required=True, attn_out_bias=True, attn_sinks=True,
             ffn_norm="post_attention_norm", moe=True, chosen_softmax=True, router_bias=True, expert_bias=True,
             activation="swiglu_oai", swa_pattern=2, swa_required=True),
    # OLMoE: q/k norms over the whole projections, softmax routing without renormalisation
    ArchSpec("olmoe", qk_norm_full=True, moe=True, ff_is_expert_ff=True, output_required=True),
    # Phi-3 / 3.5-mini, Phi-4-mini: llama's blocks with NEOX RoPE, fused q/k/v and gate/up, LongRoPE
    ArchSpec("phi3", qkv_fused_optional=True, gate_up_fused=True, long_rope=True, swa_disabled=True),
    # IBM Granite 3.x: llama's graph with the multipliers; an optional attention output bias
    ArchSpec("granite", rope=ROPE_NORMAL, attn_out_bias=True, granite_scales=True),
    # ... and its MoE: renormalised softmax routing, an ungated shared expert where the file sizes one
    ArchSpec("granitemoe", rope=ROPE_NORMAL, attn_out_bias=True, granite_scales=True, moe=True,
             expert_weights_norm=True, ff_is_expert_ff=True, shared_expert="optional", shared_gate=False),
)}


def layer_specs(spec: ArchSpec, n_layer: int, *, sliding_window: int = 0, full_attention_interval: int = 4,
                recurrent_layers: tuple[bool, ...] | None = None, shared_expert: bool = False,
                n_dense_lead: int = 0) -> tuple[LayerSpec, ...]:
    """The per-layer specs of a model of `spec` with `n_layer` layers (the first `n_dense_lead`
    with a dense FFN)."""
    if spec.moe:
        ffn = MOE_SHARED if shared_expert else MOE
    else:
        ffn = DENSE
    out = []
    for il in range(n_layer):
        if spec.hybrid_linear:
            linear = recurrent_layers[il] if recurrent_layers is not None else (il + 1) % full_attention_interval != 0
            attn = LINEAR if linear else FULL
        elif spec.swa_pattern and sliding_window:
            attn = SLIDING if (il + 1) % spec.swa_pattern != 0 else FULL
        else:
            attn = FULL
        out.append(LayerSpec(attn, DENSE if il < n_dense_lead else ffn))
    return tuple(out)
