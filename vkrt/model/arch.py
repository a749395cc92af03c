"""Architectures as data: what each GGUF `general.architecture` means for the forward pass.

An `ArchSpec` groups the architecture-wide choices into small sub-specs (RoPE, attention, norms,
FFN, routed experts, layers); its defaults are a dense llama-style decoder with NEOX RoPE, so a
row of ARCHS names only what differs. `layer_specs` turns a file's metadata into one `LayerSpec`
per layer (which attention, which FFN). Everything else -- the metadata keys read (metadata_keys.py),
the tensors a file must hold (tensors.py), the VRAM estimate, the synthetic writer, the
transformer's recording -- is derived from these, so adding an architecture is a row here plus
whatever genuinely new ops it needs.

Choices a file may make either way (MoESpec.optional, QKNorm.PER_HEAD_OPTIONAL, Packing.EITHER) are
settled per file (`experts_of` by its metadata, `with_layout` by its tensors): `ModelConfig.spec`
is the architecture as that file has it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

# attention kinds
FULL, SLIDING, LINEAR = "full", "sliding", "linear"
# FFN kinds
DENSE, MOE, MOE_SHARED = "dense", "moe", "moe_shared"


class RopeKind(Enum):
    """llama.cpp's rope types: NORMAL rotates adjacent pairs, NEOX the two halves of the rotated
    dims, IMROPE is multi-section NEOX with the sections interleaved (qwen35)."""

    NORMAL = "normal"
    NEOX = "neox"
    IMROPE = "imrope"


class QKNorm(Enum):
    """attn_{q,k}_norm: none; PER_HEAD over each head before RoPE; PER_HEAD_OPTIONAL per head
    where the file has them (glm4moe: GLM-4.5 / 4.6, not -Air); WHOLE_ROW over each token's whole
    q and k vectors (olmoe)."""

    NONE = "none"
    PER_HEAD = "per_head"
    PER_HEAD_OPTIONAL = "per_head_optional"
    WHOLE_ROW = "whole_row"


class Bias(Enum):
    """A bias the architecture has: none, OPTIONAL (used where the file has it), REQUIRED."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRED = "required"


class Packing(Enum):
    """Projections of one input stored SEPARATE or FUSED into one tensor, or EITHER way, as the
    file has them."""

    SEPARATE = "separate"
    FUSED = "fused"
    EITHER = "either"


class Router(Enum):
    """How the routed experts are chosen and weighted: SOFTMAX (the top k of the softmax over all
    experts), CHOSEN_SOFTMAX (the top k logits, weighted by the softmax of those: gpt-oss),
    SIGMOID (chosen by sigmoid + exp_probs_b, a selection bias an expert, weighted by the sigmoid;
    {arch}.expert_weights_scale, any value, multiplies the weights: glm4moe)."""

    SOFTMAX = "softmax"
    CHOSEN_SOFTMAX = "chosen_softmax"
    SIGMOID = "sigmoid"


class SharedExpert(Enum):
    """The shared expert's size: OPTIONAL (a shared expert where the file has
    expert_shared_feed_forward_length), ALWAYS (that key required), COUNT (expert_shared_count
    experts of the routed ones' size: glm4moe)."""

    OPTIONAL = "optional"
    ALWAYS = "always"
    COUNT = "count"


class Window(Enum):
    """What {arch}.attention.sliding_window does: IGNORED (not read), OPTIONAL (sliding layers
    where the file sets one), REQUIRED (the file must), NOT_APPLIED (read, warned, every layer
    attends to everything, as llama.cpp disables Phi SWA)."""

    IGNORED = "ignored"
    OPTIONAL = "optional"
    REQUIRED = "required"
    NOT_APPLIED = "not_applied"


class DeltaNet(Enum):
    """Gated DeltaNet layers between full attention ones and how their tensors lay out the heads:
    TILED (qwen35: attn_qkv / attn_gate, ssm_alpha / ssm_beta; value head j reads key head
    j % n_k_heads) or GROUPED (qwen3next: ssm_in (q, k, v, z) or attn_qkv / attn_gate, and ssm_ba
    (beta, alpha), grouped by key head; value head j reads key head j // (n_v_heads / n_k_heads));
    delta_net_layout.py turns grouped into tiled at load."""

    NONE = "none"
    TILED = "tiled"
    GROUPED = "grouped"


class Scales(Enum):
    """Multipliers on the residual stream: SQRT_EMBD (x = token_embd[ids] * sqrt(n_embd): gemma3);
    GRANITE ({arch}.embedding_scale on the embedding, residual_scale on each block's output before
    the residual add, both optional, and logit_scale dividing the logits, required)."""

    NONE = "none"
    SQRT_EMBD = "sqrt_embd"
    GRANITE = "granite"


@dataclass(frozen=True)
class RopeSpec:
    """RoPE: its kind; YaRN's rope.scaling.yarn_beta_fast / _slow read from the file (mistral3;
    llama.cpp ignores them for llama); LongRoPE's rope_factors_long / _short chosen by the context
    (phi3); sliding layers' base unless the file says (0: rope.freq_base) and freq_scale (0: the
    file's, as full layers)."""

    kind: RopeKind = RopeKind.NEOX
    yarn_betas: bool = False
    long_rope: bool = False
    swa_base: float = 0.0
    swa_scale: float = 0.0


@dataclass(frozen=True)
class AttentionSpec:
    """Softmax attention: biases of q/k/v and of the output; q/k norms; qwen35's per-head output
    gate (attn_q also yields it: o *= sigmoid(gate)); gpt-oss's sinks (attn_sinks.weight: one
    softmax sink a query head); mistral3's query temperature by position
    ({arch}.attention.temperature_scale over rope.scaling.original_context_length); whether
    {arch}.attention.scale replaces 1 / sqrt(head size) where set; q, k, v as one attn_qkv (rows
    q, k, v: phi3, where the file has it)."""

    qkv_bias: Bias = Bias.NONE
    out_bias: Bias = Bias.NONE
    qk_norm: QKNorm = QKNorm.NONE
    gate: bool = False
    sinks: bool = False
    temperature: bool = False
    scale_key: bool = False
    qkv: Packing = Packing.SEPARATE


@dataclass(frozen=True)
class NormsSpec:
    """The norm before the FFN (qwen35: post_attention_norm) and gemma3's post_attention_norm /
    post_ffw_norm on each block's output."""

    ffn: str = "ffn_norm"
    post: bool = False


@dataclass(frozen=True)
class FFNSpec:
    """The gated FFNs' (dense and experts') activation (an elementwise.activation name: silu, gelu
    or swiglu_oai) and whether ffn_up holds the gate's rows, then the up's (phi3: FUSED)."""

    activation: str = "silu"
    gate_up: Packing = Packing.SEPARATE


@dataclass(frozen=True)
class MoESpec:
    """Routed experts: the router; the default of {arch}.expert_weights_norm (the chosen weights
    renormalised); ffn_gate_inp.bias and a bias per expert (ffn_{gate,up,down}_exps.bias); the
    shared expert's size and whether its output is times sigmoid(ffn_gate_inp_shexp·x); whether
    the experts' FFN size is feed_forward_length (unless the file has expert_feed_forward_length),
    as llama.cpp reads it; {arch}.leading_dense_block_count first layers with a dense FFN;
    `optional`: routed experts only where the file has {arch}.expert_count > 0 (Mixtral-style
    files stored as llama), settled per file."""

    router: Router = Router.SOFTMAX
    weights_norm: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    shared: SharedExpert = SharedExpert.OPTIONAL
    shared_gate: bool = True
    ff_is_expert_ff: bool = False
    dense_lead: bool = False
    optional: bool = False


@dataclass(frozen=True)
class LayersSpec:
    """What the layers are beyond full attention: the sliding window (with one, every
    `swa_pattern`th layer attends globally: gemma3 6, gpt-oss 2), Gated DeltaNet layers, and a
    grouped DeltaNet's input projection as one ssm_in (FUSED) or attn_qkv / attn_gate."""

    window: Window = Window.IGNORED
    swa_pattern: int = 0
    delta_net: DeltaNet = DeltaNet.NONE
    qkvz: Packing = Packing.SEPARATE


@dataclass(frozen=True)
class LayerSpec:
    """One layer: `attn` FULL (attends to the whole context, KV cache), SLIDING (a window of
    the context, KV cache) or LINEAR (Gated DeltaNet: a recurrent state per sequence, no KV);
    `ffn` DENSE, MOE (routed experts) or MOE_SHARED (routed experts + a shared expert)."""

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
    """Architecture-wide choices; `moe` None: dense FFNs; `output_required`: output.weight must be
    in the file (llama.cpp: no fallback to token_embd). `layers` (see layer_specs) says what each
    layer is."""

    name: str
    rope: RopeSpec = field(default_factory=RopeSpec)
    attn: AttentionSpec = field(default_factory=AttentionSpec)
    norms: NormsSpec = field(default_factory=NormsSpec)
    ffn: FFNSpec = field(default_factory=FFNSpec)
    moe: MoESpec | None = None
    layers: LayersSpec = field(default_factory=LayersSpec)
    scales: Scales = Scales.NONE
    output_required: bool = False


def experts_of(spec: ArchSpec, n_expert: int | None) -> MoESpec | None:
    """The routed experts of a file of `spec` with {arch}.expert_count `n_expert` (None: dense
    FFNs): optional ones only where the file counts experts."""
    if spec.moe is None or not spec.moe.optional:
        return spec.moe
    return replace(spec.moe, optional=False) if (n_expert or 0) > 0 else None


def with_layout(spec: ArchSpec, *, qk_norm: bool, qkv_fused: bool, qkvz_fused: bool) -> ArchSpec:
    """`spec` as a file's tensors settle what it leaves open: per-head q/k norms or none, q/k/v
    as one attn_qkv or apart, a grouped DeltaNet's input as one ssm_in or attn_qkv / attn_gate
    (choices the architecture makes itself stay as they are)."""
    attn, layers = spec.attn, spec.layers
    if attn.qk_norm is QKNorm.PER_HEAD_OPTIONAL:
        attn = replace(attn, qk_norm=QKNorm.PER_HEAD if qk_norm else QKNorm.NONE)
    if attn.qkv is Packing.EITHER:
        attn = replace(attn, qkv=Packing.FUSED if qkv_fused else Packing.SEPARATE)
    if layers.qkvz is Packing.EITHER:
        layers = replace(layers, qkvz=Packing.FUSED if qkvz_fused else Packing.SEPARATE)
    return replace(spec, attn=attn, layers=layers)


_POST_ATTN_FFN_NORM = NormsSpec(ffn="post_attention_norm")
# Mixtral-style files stored as llama: routed experts where the file counts them, softmax routing,
# the chosen weights renormalised (llama.cpp's llama graph), their size in feed_forward_length
_COUNTED_EXPERTS = MoESpec(weights_norm=True, ff_is_expert_ff=True, optional=True)
_LLAMA = ArchSpec("llama", rope=RopeSpec(RopeKind.NORMAL), moe=_COUNTED_EXPERTS)
# Qwen3.5: gated attention with multi-section RoPE on a quarter of the head, Gated DeltaNet layers
_QWEN35 = ArchSpec("qwen35", rope=RopeSpec(RopeKind.IMROPE), attn=AttentionSpec(qk_norm=QKNorm.PER_HEAD, gate=True),
                  norms=_POST_ATTN_FFN_NORM, layers=LayersSpec(delta_net=DeltaNet.TILED))
_QWEN35MOE = replace(_QWEN35, name="qwen35moe", moe=MoESpec(weights_norm=True, shared=SharedExpert.ALWAYS))
# IBM Granite 3.x: llama's graph with the multipliers; an optional attention output bias
_GRANITE = ArchSpec("granite", rope=RopeSpec(RopeKind.NORMAL), scales=Scales.GRANITE,
                   attn=AttentionSpec(out_bias=Bias.OPTIONAL, scale_key=True))

ARCHS: dict[str, ArchSpec] = {s.name: s for s in (
    _LLAMA,
    # Ministral 3 / Mistral Small 3.x text: llama's with the queries' temperature, the file's YaRN
    # betas and attention.scale
    replace(_LLAMA, name="mistral3", rope=RopeSpec(RopeKind.NORMAL, yarn_betas=True),
            attn=AttentionSpec(temperature=True, scale_key=True)),
    ArchSpec("qwen2", attn=AttentionSpec(qkv_bias=Bias.OPTIONAL)),
    ArchSpec("qwen3", attn=AttentionSpec(qk_norm=QKNorm.PER_HEAD)),
    ArchSpec("gemma3", rope=RopeSpec(swa_base=10000.0, swa_scale=1.0), attn=AttentionSpec(qk_norm=QKNorm.PER_HEAD),
             norms=NormsSpec(post=True), ffn=FFNSpec(activation="gelu"), scales=Scales.SQRT_EMBD,
             layers=LayersSpec(window=Window.OPTIONAL, swa_pattern=6)),
    ArchSpec("qwen2moe", attn=AttentionSpec(qkv_bias=Bias.OPTIONAL), moe=MoESpec()),
    ArchSpec("qwen3moe", attn=AttentionSpec(qk_norm=QKNorm.PER_HEAD), moe=MoESpec(weights_norm=True)),
    _QWEN35,
    _QWEN35MOE,
    # Qwen3-Next: qwen35moe's blocks with NEOX RoPE (rope.dimension_count of the head) and the
    # grouped DeltaNet layout
    replace(_QWEN35MOE, name="qwen3next", rope=RopeSpec(),
            layers=LayersSpec(delta_net=DeltaNet.GROUPED, qkvz=Packing.EITHER)),
    # GLM-4.5 / 4.6 (and -Air): attention biases, partial NEOX RoPE, optional q/k norms; leading
    # dense layers, then sigmoid-routed experts with a selection bias and an ungated shared expert
    ArchSpec("glm4moe", attn=AttentionSpec(qkv_bias=Bias.REQUIRED, qk_norm=QKNorm.PER_HEAD_OPTIONAL),
             norms=_POST_ATTN_FFN_NORM, moe=MoESpec(router=Router.SIGMOID, shared=SharedExpert.COUNT,
                                                    shared_gate=False, dense_lead=True)),
    # gpt-oss: even layers attend to a sliding window (llama.cpp's set_swa_pattern(2)), YaRN from
    # the file's rope.scaling keys
    ArchSpec("gpt-oss", attn=AttentionSpec(qkv_bias=Bias.REQUIRED, out_bias=Bias.REQUIRED, sinks=True),
             norms=_POST_ATTN_FFN_NORM, ffn=FFNSpec(activation="swiglu_oai"),
             moe=MoESpec(router=Router.CHOSEN_SOFTMAX, router_bias=True, expert_bias=True),
             layers=LayersSpec(window=Window.REQUIRED, swa_pattern=2)),
    # OLMoE: q/k norms over the whole projections, softmax routing without renormalisation
    ArchSpec("olmoe", attn=AttentionSpec(qk_norm=QKNorm.WHOLE_ROW), moe=MoESpec(ff_is_expert_ff=True),
             output_required=True),
    # Phi-3 / 3.5-mini, Phi-4-mini: llama's blocks with NEOX RoPE, q/k/v as one attn_qkv (separate
    # where the file has them, as llama.cpp), gate and up as one ffn_up, LongRoPE
    ArchSpec("phi3", rope=RopeSpec(long_rope=True), attn=AttentionSpec(qkv=Packing.EITHER),
             ffn=FFNSpec(gate_up=Packing.FUSED), layers=LayersSpec(window=Window.NOT_APPLIED)),
    _GRANITE,
    # ... and its MoE: renormalised softmax routing, an ungated shared expert where the file sizes one
    replace(_GRANITE, name="granitemoe", moe=MoESpec(weights_norm=True, ff_is_expert_ff=True, shared_gate=False)),
)}


def layer_specs(spec: ArchSpec, n_layer: int, *, sliding_window: int = 0, full_attention_interval: int = 4,
                recurrent_layers: tuple[bool, ...] | None = None, shared_expert: bool = False,
                n_dense_lead: int = 0) -> tuple[LayerSpec, ...]:
    """The per-layer specs of a model of `spec` with `n_layer` layers (the first `n_dense_lead`
    with a dense FFN)."""
    if spec.moe is not None:
        ffn = MOE_SHARED if shared_expert else MOE
    else:
        ffn = DENSE
    pattern = spec.layers.swa_pattern
    out = []
    for il in range(n_layer):
        if spec.layers.delta_net is not DeltaNet.NONE:
            linear = recurrent_layers[il] if recurrent_layers is not None else (il + 1) % full_attention_interval != 0
            attn = LINEAR if linear else FULL
        elif pattern and sliding_window:
            attn = SLIDING if (il + 1) % pattern != 0 else FULL
        else:
            attn = FULL
        out.append(LayerSpec(attn, DENSE if il < n_dense_lead else ffn))
    return tuple(out)
