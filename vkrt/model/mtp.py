"""Multi-token prediction (MTP, "NextN") blocks: the decoder block Qwen3.5 / Qwen3.6, Qwen3-Next
and GLM-4.5 / 4.6 (glm4moe) files carry after the trunk (blk.{n_layer}.*, `{arch}.nextn_predict_layers`
of them, counted in block_count), which predicts the token after next from the trunk's final
state at a position and the embedding of the token that follows it (llama.cpp's
src/models/qwen35moe.cpp, graph_mtp; GLM's as vLLM's glm4_moe_mtp.py: llama.cpp loads it, unused):

    z = eh_proj · [rms_norm(embed[t_{p+1}]) * enorm ; rms_norm(h_p) * hnorm]
    z = the block (full attention of the trunk's kind, then its FFN or experts) on z
    h'_p = rms_norm(z) * shared_head_norm             (output_norm where the file has none)
    logits = output · h'_p                            (shared_head_head where the file has one)

embed is token_embd, or nextn.embed_tokens where the file gives the block its own (some GLM
files carry it). The block is the one the trunk's layer rule gives its index: GLM's has the
routed and shared experts (it is past the leading dense blocks), attention with q/k/v biases and
partial RoPE as the trunk's. h_p is the trunk's normed final state (what its output matrix
reads); a chain of drafts feeds h'_p back as the next position's h. The head runs as a model of
one layer (mtp_config) whose block is the file's renamed to blk.0, with its own KV cache.
(vLLM zeroes the embedding at position 0; vkrt, as llama.cpp's graph_mtp, does not: only the
drafts could differ.)
"""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from .arch import FULL, LayerSpec, layer_specs
from .config import ModelConfig
from .tensors import EMBED, MATRIX, NORM, TensorSpec, layer_tensors

MTP_ARCHS = ("qwen35", "qwen35moe", "qwen3next", "glm4moe")
EH_PROJ, ENORM, HNORM = "nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight"
HEAD_NORM, HEAD, EMBED_TOKENS = "nextn.shared_head_norm.weight", "nextn.shared_head_head.weight", \
    "nextn.embed_tokens.weight"
# an MTP head's step inputs beside its weights: the trunk's states (host-written, [n_embd, n_ubatch])
# and the concatenated normed input ([2 n_embd, n_ubatch])
MTP_HIDDEN, MTP_CONCAT = "nextn.hidden_in", "nextn.concat"


def mtp_config(cfg: ModelConfig, block: int = 0) -> ModelConfig:
    """The one-layer model MTP block `block` runs as: the trunk's config with one full-attention
    layer whose FFN is the one the trunk's rule gives block index n_layer + block (the experts
    past GLM's leading dense blocks, as llama.cpp loads it)."""
    if cfg.arch not in MTP_ARCHS:
        raise ConfigError(f"MTP drafting runs the MTP blocks of {', '.join(MTP_ARCHS)} models; this is {cfg.arch}")
    if cfg.n_layer_nextn < 1:
        raise ConfigError(f"the model ({cfg.arch}) has no MTP block ({cfg.arch}.nextn_predict_layers is 0): "
                          f"use --spec-type ngram or a draft model (-md)")
    il = cfg.n_layer + block
    ffn = layer_specs(cfg.spec, il + 1, shared_expert=cfg.n_ff_shared > 0, n_dense_lead=cfg.n_dense_lead)[il].ffn
    return dataclasses.replace(cfg, n_layer=1, layers=(LayerSpec(FULL, ffn),), n_layer_nextn=0, n_dense_lead=0)


def mtp_tensors(cfg: ModelConfig, block: int = 0) -> list[TensorSpec]:
    """The tensors of MTP block `block` (0: the first) as the file names them (blk.{n_layer + block}.*):
    the block's layer tensors, then eh_proj, enorm, hnorm and shared_head_norm."""
    il, E = cfg.n_layer + block, cfg.n_embd
    out = [dataclasses.replace(t, name=t.name.replace("blk.0.", f"blk.{il}.", 1))
           for t in layer_tensors(mtp_config(cfg, block), 0)]
    p = f"blk.{il}."
    return out + [TensorSpec(p + EH_PROJ, (2 * E, E), MATRIX), TensorSpec(p + ENORM, (E,), NORM),
                  TensorSpec(p + HNORM, (E,), NORM), TensorSpec(p + HEAD_NORM, (E,), NORM, required=False),
                  TensorSpec(p + HEAD, (E, cfg.vocab_size), EMBED, required=False),
                  TensorSpec(p + EMBED_TOKENS, (E, cfg.vocab_size), EMBED, required=False)]
