"""The tensors a model of a given config holds, by GGUF name, with their shapes (ggml order:
ne[0] innermost) and roles. The loader checks files against this list, the synthetic writer
writes it, the transformer reads by these names."""

from __future__ import annotations

import re

from dataclasses import dataclass, replace

from ..errors import GGUFError
from .arch import DENSE, LINEAR, MOE_SHARED, Bias, DeltaNet, Packing, QKNorm, Router, with_layout
from .config import ModelConfig

EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
# weights read in one mat-vec pass when they share an allocation: a gated FFN's gate and up
SHARED_ALLOCATIONS = (("ffn_gate.weight", "ffn_up.weight"), ("ffn_gate_exps.weight", "ffn_up_exps.weight"),
                      ("ffn_gate_shexp.weight", "ffn_up_shexp.weight"),
                      # projections of one input, read as one matmul (the stacked fusion): attention's,
                      # a DeltaNet block's
                      ("attn_q.weight", "attn_k.weight", "attn_v.weight"),
                      ("attn_qkv.weight", "attn_gate.weight"), ("ssm_alpha.weight", "ssm_beta.weight"))

# roles: how a synthetic model fills the tensor (and which weight type it gets)
EMBED, MATRIX, EXPERTS, ROUTER, NORM, BIAS, CONV, SSM_A, DT_BIAS, EXPERT_BIAS, SINKS, ROPE_FACTORS = (
    "embed", "matrix", "experts", "router", "norm", "bias", "conv", "ssm_a", "dt_bias", "expert_bias", "sinks",
    "rope_factors")
# roles whose tensors the kernels read as plain F32 vectors (norm weights, biases, the conv taps,
# DeltaNet's per-head constants, gpt-oss's per-expert biases and attention sinks, LongRoPE's
# factors); GGUF converters keep them F32
F32_ROLES = (NORM, BIAS, CONV, SSM_A, DT_BIAS, EXPERT_BIAS, SINKS, ROPE_FACTORS)
# LongRoPE's frequency divisors (phi3): one a rotated pair, for contexts past the original one or not
LONG_ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]
    role: str
    required: bool = True


def grouped_delta_net(cfg: ModelConfig) -> bool:
    """The file lays the DeltaNet heads out grouped by key head (qwen3next; arch.py)."""
    return cfg.spec.layers.delta_net is DeltaNet.GROUPED


def layer_tensors(cfg: ModelConfig, il: int, *, graph: bool = False) -> list[TensorSpec]:
    """Layer il's tensors in the order the synthetic writer lays them out: as the file holds
    them, or (`graph`) as the transformer reads them (a grouped DeltaNet's fused projections
    split into qwen35's attn_qkv / attn_gate and ssm_alpha / ssm_beta by the loader; phi3's
    attn_qkv and gate+up ffn_up seen as attn_q/k/v and ffn_gate / ffn_up: fused_views.py)."""
    p, E, layer, spec = f"blk.{il}.", cfg.n_embd, cfg.layers[il], cfg.spec
    attn, moe = spec.attn, spec.moe
    out: list[TensorSpec] = [TensorSpec(p + "attn_norm.weight", (E,), NORM)]

    def t(name, ne, role, required=True):
        out.append(TensorSpec(p + name, tuple(ne), role, required))

    if layer.attn == LINEAR:
        D, Hv = cfg.ssm_head_dim, cfg.ssm_v_heads
        grouped = grouped_delta_net(cfg) and not graph
        if grouped and spec.layers.qkvz is Packing.FUSED:
            t("ssm_in.weight", (E, cfg.ssm_conv_dim + Hv * D), MATRIX)
        else:
            t("attn_qkv.weight", (E, cfg.ssm_conv_dim), MATRIX)
            t("attn_gate.weight", (E, Hv * D), MATRIX)
        t("ssm_conv1d.weight", (cfg.ssm_conv_kernel, cfg.ssm_conv_dim), CONV)
        t("ssm_dt.bias", (Hv,), DT_BIAS)
        t("ssm_a", (Hv,), SSM_A)
        if grouped:
            t("ssm_ba.weight", (E, 2 * Hv), MATRIX)
        else:
            t("ssm_alpha.weight", (E, Hv), MATRIX)
            t("ssm_beta.weight", (E, Hv), MATRIX)
        t("ssm_norm.weight", (D,), NORM)
        t("ssm_out.weight", (Hv * D, E), MATRIX)
    else:
        H, KV, Dk, Dv = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
        if attn.qkv is Packing.FUSED and not graph:
            t("attn_qkv.weight", (E, H * Dk + KV * Dk + KV * Dv), MATRIX)
        else:
            t("attn_q.weight", (E, H * Dk * (2 if attn.gate else 1)), MATRIX)
            t("attn_k.weight", (E, KV * Dk), MATRIX)
            t("attn_v.weight", (E, KV * Dv), MATRIX)
        t("attn_output.weight", (H * Dv, E), MATRIX)
        if attn.qkv_bias is not Bias.NONE:
            for name, n in (("q", H * Dk), ("k", KV * Dk), ("v", KV * Dv)):
                t(f"attn_{name}.bias", (n,), BIAS, required=attn.qkv_bias is Bias.REQUIRED)
        if attn.out_bias is not Bias.NONE:
            t("attn_output.bias", (E,), BIAS, required=attn.out_bias is Bias.REQUIRED)
        if attn.sinks:
            t("attn_sinks.weight", (H,), SINKS)
        if attn.qk_norm is QKNorm.PER_HEAD:
            t("attn_q_norm.weight", (Dk,), NORM)
            t("attn_k_norm.weight", (Dk,), NORM)
        if attn.qk_norm is QKNorm.WHOLE_ROW:
            t("attn_q_norm.weight", (H * Dk,), NORM)
            t("attn_k_norm.weight", (KV * Dk,), NORM)
    if spec.norms.post:
        t("post_attention_norm.weight", (E,), NORM)
        t("post_ffw_norm.weight", (E,), NORM)
    t(spec.norms.ffn + ".weight", (E,), NORM)
    if layer.ffn == DENSE and spec.ffn.gate_up is Packing.FUSED and not graph:   # the gate's rows, then the up's
        t("ffn_up.weight", (E, 2 * cfg.n_ff), MATRIX)
        t("ffn_down.weight", (cfg.n_ff, E), MATRIX)
    elif layer.ffn == DENSE:
        t("ffn_gate.weight", (E, cfg.n_ff), MATRIX)
        t("ffn_up.weight", (E, cfg.n_ff), MATRIX)
        t("ffn_down.weight", (cfg.n_ff, E), MATRIX)
    else:
        n_e, fe = cfg.n_expert, cfg.n_ff_expert
        t("ffn_gate_inp.weight", (E, n_e), ROUTER)
        if moe.router_bias:
            t("ffn_gate_inp.bias", (n_e,), EXPERT_BIAS)
        if moe.router is Router.SIGMOID:
            t("exp_probs_b.bias", (n_e,), EXPERT_BIAS)
        t("ffn_gate_exps.weight", (E, fe, n_e), EXPERTS)
        t("ffn_up_exps.weight", (E, fe, n_e), EXPERTS)
        t("ffn_down_exps.weight", (fe, E, n_e), EXPERTS)
        if moe.expert_bias:
            t("ffn_gate_exps.bias", (fe, n_e), EXPERT_BIAS)
            t("ffn_up_exps.bias", (fe, n_e), EXPERT_BIAS)
            t("ffn_down_exps.bias", (E, n_e), EXPERT_BIAS)
        if layer.ffn == MOE_SHARED:
            if moe.shared_gate:
                t("ffn_gate_inp_shexp.weight", (E,), ROUTER)
            t("ffn_gate_shexp.weight", (E, cfg.n_ff_shared), MATRIX)
            t("ffn_up_shexp.weight", (E, cfg.n_ff_shared), MATRIX)
            t("ffn_down_shexp.weight", (cfg.n_ff_shared, E), MATRIX)
    return out


def model_tensors(cfg: ModelConfig, *, tied_output: bool = False, graph: bool = False) -> list[TensorSpec]:
    """Every tensor of the model (MTP blocks past the trunk excluded), in file order (`graph`:
    as the transformer reads them); the output matrix is optional (llama.cpp falls back to
    token_embd) unless the architecture requires it."""
    E, V = cfg.n_embd, cfg.vocab_size
    out = [TensorSpec("token_embd.weight", (E, V), EMBED)]
    if cfg.spec.rope.long_rope:   # optional, as llama.cpp (without them: plain RoPE)
        out += [TensorSpec(name, (cfg.rope_dims // 2,), ROPE_FACTORS, required=False) for name in LONG_ROPE_FACTORS]
    for il in range(cfg.n_layer):
        out += layer_tensors(cfg, il, graph=graph)
    out.append(TensorSpec("output_norm.weight", (E,), NORM))
    if not tied_output:
        out.append(TensorSpec("output.weight", (E, V), EMBED,
                              required=cfg.spec.output_required))
    return out


def required_tensors(cfg: ModelConfig, *, graph: bool = False) -> list[str]:
    return [t.name for t in model_tensors(cfg, graph=graph) if t.required]


def file_layout(cfg: ModelConfig, tensors) -> ModelConfig:
    """`cfg` with its spec settled by the file's tensor names (arch.with_layout): whether optional
    q/k norms are there (glm4moe: every layer's, as the first attention layer's), whether
    attention's projections are one attn_qkv (phi3: likewise), whether a grouped DeltaNet's input
    projection is one ssm_in (qwen3next: every layer's, as the first DeltaNet layer's; llama.cpp
    takes either form)."""
    first_kv = f"blk.{cfg.kv_layers[0]}." if cfg.kv_layers else None
    first_linear = f"blk.{cfg.linear_layers[0]}." if cfg.linear_layers else None
    return replace(cfg, spec=with_layout(
        cfg.spec, qk_norm=first_kv is not None and first_kv + "attn_q_norm.weight" in tensors,
        qkv_fused=first_kv is not None and first_kv + "attn_qkv.weight" in tensors,
        qkvz_fused=first_linear is not None and first_linear + "ssm_in.weight" in tensors))


def _trimmed(ne) -> tuple[int, ...]:
    ne = list(ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)


def check_expert_layout(tensors: dict, path: str) -> None:
    """Experts stored one tensor each (blk.N.ffn_gate.E.weight: Mixtral files converted before
    llama.cpp stacked them) get a GGUFError saying to convert the model again."""
    split = sorted(n for n in tensors if re.fullmatch(r"blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight", n))
    if split:
        raise GGUFError(f"{path}: its experts are stored one tensor each ({split[0]}, ...: an old Mixtral "
                        f"conversion); convert the model again with a current llama.cpp (convert_hf_to_gguf.py "
                        f"writes one ffn_*_exps stack a layer)")


def check_tensors(cfg: ModelConfig, tensors: dict, path: str) -> None:
    """Raise one GGUFError naming every tensor whose shape differs from what `cfg` implies
    (missing ones are reported by GGUFFile.require)."""
    wrong = []
    for spec in model_tensors(cfg):
        info = tensors.get(spec.name)
        if info is not None and _trimmed(info.ne) != _trimmed(spec.ne):
            wrong.append(f"{spec.name} has shape {list(info.ne)}, expected {list(spec.ne)}")
        elif info is not None and spec.role in F32_ROLES and info.type.name != "F32":
            wrong.append(f"{spec.name} is {info.type.name}, expected F32")
    ffn_biases = sorted(n for n in tensors if re.fullmatch(r"blk\.\d+\.ffn_(gate|up|down)\.bias", n))
    qkv_biases = sorted(n for n in tensors if re.fullmatch(r"blk\.\d+\.attn_qkv\.bias", n))
    if qkv_biases and cfg.spec.attn.qkv is Packing.FUSED:
        wrong.append(f"fused attention biases ({qkv_biases[0]}, ...) are not supported")
    if ffn_biases:
        wrong.append(f"dense FFN biases ({ffn_biases[0]}, ...) are not supported")
    if "ffn_gate_up_exps" in " ".join(n for n in tensors if n.startswith("blk.0.")):
        wrong.append("fused gate+up expert stacks (ffn_gate_up_exps) are not supported; use a file with "
                     "separate ffn_gate_exps / ffn_up_exps")
    if wrong:
        more = f" (and {len(wrong) - 8} more)" if len(wrong) > 8 else ""
        raise GGUFError(f"{path}: {cfg.arch} model tensors do not match its metadata: {'; '.join(wrong[:8])}{more}")
