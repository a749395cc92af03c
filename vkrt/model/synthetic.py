"""Random-weight GGUF models with real architecture metadata and a small byte-level BPE
tokenizer: tiny models for tests, full-size layer shapes for benchmarks. Deterministic for a
seed; llama.cpp loads them."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import numpy as np
import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from ..errors import VkrtError
from .arch import ARCHS, ArchSpec, DeltaNet, RopeKind, Router, SharedExpert, with_layout
from .config import GATING_SIGMOID, ModelConfig
from .metadata_keys import write_keys
from .mtp import EMBED_TOKENS, HEAD, HEAD_NORM, mtp_tensors
from .quant_mix import mix_types
from .random_weights import check_row, random_weight
from .tensors import (BIAS, CONV, DT_BIAS, EMBED, EXPERT_BIAS, EXPERTS, MATRIX, NORM, ROPE_FACTORS, ROUTER, SINKS, SSM_A,
                      model_tensors)

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello, world! The capital of France is Paris. "
    "Once upon a time there was a small model that learned to count: one, two, three, 1 2 3 4 5. "
    "def add(a, b):\n    return a + b\n\nUser: what is the weather like today?\nAssistant: sunny.\n"
)


@dataclass
class SyntheticSpec:
    """Shapes and types of a generated model. Defaults: a tiny dense model for tests."""

    arch: str = "llama"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_ctx: int = 512
    weight_type: str = "Q8_0"          # type of the 2-D weight matrices
    expert_type: str | None = None     # type of ffn_*_exps (default: weight_type)
    ffn_type: str | None = None        # type of the dense FFN matrices ffn_* (default: weight_type)
    mix: str = ""                      # a llama.cpp quantisation mix over those (quant_mix.MIXES: "Q4_K_M")
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    n_ff_shared: int = 0
    vocab_merges: int = 200
    sliding_window: int = 0
    seed: int = 0
    random_blocks: bool = False        # random valid blocks instead of quantising (fast, for big models)
    pad_vocab_to: int = 0              # append unused tokens up to this vocabulary size (real output shapes)
    dequantized: bool = False          # store every quantised weight as its F32 dequantisation (a reference twin)
    rope_dims: int = 0                 # rotated dims per head (0: all)
    rope_base: float = 10000.0
    rope_scaling: str = ""             # rope.scaling.type ("yarn", "linear"; "": none written)
    rope_scaling_factor: float = 0.0
    rope_orig_ctx: int = 0             # rope.scaling.original_context_length (YaRN, LongRoPE)
    rope_attn_factor: float = 0.0      # rope.scaling.attn_factor (0: not written)
    qkv_fused: bool = True             # phi3: one attn_qkv, else attn_q / attn_k / attn_v
    # qwen35: Gated DeltaNet layers ((il + 1) % full_attention_interval != 0) and sectioned RoPE
    full_attention_interval: int = 4
    ssm_conv_kernel: int = 4
    ssm_head_dim: int = 0              # 0: head_dim
    ssm_k_heads: int = 2
    ssm_v_heads: int = 4
    rope_sections: tuple = (2, 1, 1, 0)   # written for IMROPE archs (qwen35) only
    qkvz_fused: bool = True            # qwen3next: one ssm_in (older converters), else attn_qkv / attn_gate
    # glm4moe: leading dense layers, the routing weights' scale, the routing renormalised, the
    # optional q/k norms (GLM-4.5 / 4.6 have them, -Air not); its shared expert is n_ff_shared wide
    # (a multiple of n_ff_expert: expert_shared_count of them)
    n_dense_lead: int = 0
    expert_weights_scale: float = 0.0
    expert_weights_norm: bool = True
    qk_norm: bool = False
    # MTP blocks after the trunk (nextn_predict_layers: qwen35, qwen35moe, qwen3next, glm4moe) with
    # llama.cpp's blk.{n_layer}.nextn.* names; nextn_own_head: each with its own embed_tokens and
    # shared_head_head (some GLM files), else the trunk's serve
    n_nextn: int = 0
    nextn_own_head: bool = False
    # granite's multipliers (written for granite / granitemoe; 0: left out, as the converter does)
    embedding_scale: float = 0.0
    residual_scale: float = 0.0
    attention_scale: float = 0.0
    logit_scale: float = 1.0
    tokenizer_pre: str = "gpt-2"
    chat_template: str | None = None
    extra: dict = field(default_factory=dict)
    # general.name ("": "vkrt synthetic <arch>"). llama.cpp gives token attributes by the name:
    # one containing "phi3" or "phi-3" makes it look up SentencePiece's <s>, </s> and <unk>,
    # which these byte-level vocabularies lack, and refuse the file
    name: str = ""


def _bpe_vocab(n_merges: int) -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary (specials, the 256 bytes, merges) trained on a fixed text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=len(specials) + 256 + n_merges, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    import json
    model = json.loads(tok.to_str())["model"]
    # only tokens of ASCII bytes: every generated token is then whole UTF-8 text (llama.cpp's
    # server refuses to return text that ends inside a multi-byte character)
    byte_of = _gpt2_byte_decoder()
    keep = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])
            if t in specials or all(byte_of.get(c, 255) < 0x80 for c in t)]
    kept = set(keep)
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    merges = [m for m in merges if all(part in kept for part in m.split(" ")) and m.replace(" ", "") in kept]
    types = [3 if t in specials else 1 for t in keep]
    return keep, types, merges


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def write_model(path: str | os.PathLike, spec: SyntheticSpec) -> str:
    """Write a GGUF for `spec` to `path` and return the path."""
    s = spec
    rng = np.random.default_rng(s.seed)
    arch = s.arch
    if arch not in ARCHS:
        raise VkrtError(f"synthetic models of architecture {arch!r} are not supported "
                        f"(supported: {', '.join(sorted(ARCHS))})")
    wtype = Q[s.weight_type.upper()]
    etype = Q[(s.expert_type or s.weight_type).upper()]
    tokens, types, merges = _bpe_vocab(s.vocab_merges)
    if s.pad_vocab_to > len(tokens):
        tokens = tokens + [f"<unused{i}>" for i in range(s.pad_vocab_to - len(tokens))]
        types = types + [5] * (s.pad_vocab_to - len(types))  # 5: unused
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_name(s.name or f"vkrt synthetic {arch}")
    write_keys(w, ARCHS[arch], _key_values(s, ARCHS[arch], n_vocab))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(s.tokenizer_pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(s.chat_template or _CHAT_TEMPLATE)
    for key, value in s.extra.items():
        w.add_key_value(key, value[0], value[1])
    meta = {k: v.value for k, v in w.kv_data[0].items()}
    cfg = ModelConfig.from_metadata(meta, os.fspath(path))
    cfg = dataclasses.replace(cfg, spec=with_layout(cfg.spec, qk_norm=s.qk_norm, qkv_fused=s.qkv_fused,
                                                    qkvz_fused=s.qkvz_fused))

    # first the table of tensors, then their data one at a time: a 30B-shaped model never has
    # to fit in memory. Data comes from `rng` in table order, so files are deterministic.
    embd_type = Q.Q8_0 if wtype not in (Q.F32, Q.F16) else wtype
    ftype = Q[s.ffn_type.upper()] if s.ffn_type else wtype
    tied = arch in _TIED_OUTPUT
    table = model_tensors(cfg, tied_output=tied)
    own = (HEAD_NORM, HEAD, EMBED_TOKENS) if s.nextn_own_head else (HEAD_NORM,)
    table += [t for b in range(s.n_nextn) for t in mtp_tensors(cfg, b) if t.required or t.name.endswith(own)]
    specs = [_synthetic_tensor(t, wtype, etype, embd_type, ftype) for t in table]
    if s.mix:
        types = mix_types(s.mix, [(name, shape[-1], qtype if kind == "weight" else Q.F32)
                                  for name, kind, qtype, shape, _ in specs], s.n_layer)
        specs = [(name, kind, typ, shape, std) for (name, kind, _, shape, std), typ in zip(specs, types)]
    for name, kind, qtype, shape, std in specs:
        if kind == "weight":
            check_row(qtype, shape)
            block, size = GGML_QUANT_SIZES[qtype]
            nbytes = int(np.prod(shape[:-1])) * shape[-1] // block * size
            if s.dequantized and qtype not in (Q.F32, Q.F16):
                w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
            elif qtype in (Q.F32, Q.F16):
                w.add_tensor_info(name, shape, np.dtype(np.float32 if qtype == Q.F32 else np.float16), nbytes)
            else:  # quantised: the writer takes the shape in bytes per row
                w.add_tensor_info(name, (*shape[:-1], shape[-1] // block * size), np.dtype(np.uint8), nbytes,
                                  raw_dtype=qtype)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, kind, qtype, shape, std in specs:
        data = _tensor_data(rng, kind, qtype, shape, std, s.random_blocks)
        if s.dequantized and kind == "weight" and qtype not in (Q.F32, Q.F16):
            data = gguf.quants.dequantize(data, qtype).reshape(shape).astype(np.float32)
        w.write_tensor_data(data)
    w.close()
    return os.fspath(path)


_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# these synthetic models tie the output matrix to token_embd (granite: as Granite 3.x)
_TIED_OUTPUT = ("gemma3", "qwen2", "granite", "granitemoe")
# files that give feed_forward_length beside their experts' size (as qwen2moe's converter does)
_FF_WITH_EXPERTS = ("qwen2moe",)


def _key_values(s: SyntheticSpec, spec: ArchSpec, n_vocab: int) -> dict:
    """`s` as values of metadata_keys fields (None: not written); write_keys writes those a file
    of `spec` has."""
    moe, experts = spec.moe, s.n_expert > 0 and spec.moe is not None
    sigmoid = experts and moe.router is Router.SIGMOID
    n_shared_experts = None
    if experts and moe.shared is SharedExpert.COUNT:
        if not s.n_ff_shared or s.n_ff_shared % s.n_ff_expert:
            raise VkrtError(f"{s.arch}: n_ff_shared {s.n_ff_shared} must be a multiple of n_ff_expert "
                            f"{s.n_ff_expert} (expert_shared_count experts)")
        n_shared_experts = s.n_ff_shared // s.n_ff_expert
    n_ff = s.n_ff
    if experts and moe.ff_is_expert_ff:   # feed_forward_length holds the experts' size (written_under)
        n_ff = None
    elif experts:   # the dense FFNs' size beside the experts' where asked
        n_ff = (s.n_ff or s.n_ff_expert) if s.n_ff or s.arch in _FF_WITH_EXPERTS else None
    D = s.ssm_head_dim or s.head_dim
    delta_net = spec.layers.delta_net is not DeltaNet.NONE

    def moe_value(value):
        return value if experts else None

    return dict(
        n_ctx_train=s.n_ctx, n_embd=s.n_embd, n_blocks=s.n_layer + s.n_nextn, n_layer_nextn=s.n_nextn or None, n_head=s.n_head, n_head_kv=s.n_head_kv,
        head_dim_k=s.head_dim, head_dim_v=s.head_dim, rope_dims=s.rope_dims or s.head_dim, rope_base=s.rope_base,
        norm_eps=1e-6, vocab_size=n_vocab, n_expert=moe_value(s.n_expert), n_expert_used=moe_value(s.n_expert_used),
        n_ff_expert=moe_value(s.n_ff_expert),
        n_shared_experts=n_shared_experts, n_ff_shared=moe_value(s.n_ff_shared or None),
        expert_gating_func=moe_value(GATING_SIGMOID), expert_weights_norm=s.expert_weights_norm if sigmoid else None,
        expert_weights_scale=(s.expert_weights_scale or None) if sigmoid else None,
        n_dense_lead=moe_value(s.n_dense_lead or None), n_ff=n_ff, sliding_window=s.sliding_window or None,
        embd_scale=s.embedding_scale or None, residual_scale=s.residual_scale or None,
        attn_scale=s.attention_scale or None, logit_scale=s.logit_scale or None,
        rope_scaling=s.rope_scaling or None, rope_factor=s.rope_scaling_factor if s.rope_scaling else None,
        n_ctx_orig=s.rope_orig_ctx or None, rope_attn_factor=s.rope_attn_factor or None,
        ssm_conv_kernel=s.ssm_conv_kernel, ssm_head_dim=D, ssm_k_heads=s.ssm_k_heads, ssm_v_heads=s.ssm_v_heads,
        ssm_inner_size=s.ssm_v_heads * D, full_attention_interval=s.full_attention_interval if delta_net else None,
        rope_sections=list(s.rope_sections) if spec.rope.kind is RopeKind.IMROPE else None)


def _synthetic_tensor(t, wtype, etype, embd_type, ftype) -> tuple:
    """(name, kind, type, numpy shape, std) of one tensor of the table."""
    shape = tuple(reversed(t.ne))
    role = t.role
    if role == EMBED:
        return t.name, "weight", embd_type, shape, 0.5
    if role in (MATRIX, EXPERTS):
        typ = etype if role == EXPERTS else ftype if ".ffn_" in t.name else wtype
        return t.name, "weight", typ, shape, shape[-1] ** -0.5
    if role in (ROUTER, CONV):
        return t.name, "weight", Q.F32, shape, 0.5
    return t.name, role, Q.F32, shape, {NORM: 0.1, BIAS: 0.02, SSM_A: 0.0, DT_BIAS: 0.5, EXPERT_BIAS: 0.5,
                                        SINKS: 1.5, ROPE_FACTORS: 8.0}[role]


def _tensor_data(rng, kind: str, qtype, shape: tuple, std: float, random_blocks: bool) -> np.ndarray:
    if kind == "weight":
        return random_weight(rng, qtype, shape, std, random_blocks)[0]
    if kind == NORM:
        return (1.0 + std * rng.standard_normal(shape[0])).astype(np.float32)
    if kind == ROPE_FACTORS:   # LongRoPE's divisors: 1 for the fast pairs up to ~std for the slow ones
        return np.sort(rng.uniform(1.0, std, shape[0])).astype(np.float32)
    if kind == SSM_A:   # -exp(A_log): per-head decay rates in [-8, -1]
        return -np.exp(rng.uniform(0.0, np.log(8.0), shape[0])).astype(np.float32)
    if kind == DT_BIAS:  # softplus(alpha + dt_bias) around 0.1: decays of a few percent a token
        return (-2.0 + std * rng.standard_normal(shape[0])).astype(np.float32)
    return (std * rng.standard_normal(shape)).astype(np.float32)
