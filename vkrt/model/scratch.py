"""The activations of one forward pass, allocated once for up to T tokens and reused by every
layer and step. Shapes are ggml's [rows, tokens] (rows innermost). `scratch_shapes` is the one
table: Scratch allocates it and the VRAM estimate sums it."""

from __future__ import annotations

import math

import numpy as np

from ..commands import write_tensor
from ..memory import F16, F32, I32, Tensor
from ..ops.delta_net import delta_net_workspace_bytes
from ..ops.flash_work import FlashWork
from ..ops.moe import ROUTE_COUNTERS
from ..ops.moe_stage import plan_words
from ..ops.mul_mat_id import RouteTable
from ..owned import Owned
from .arch import DENSE, MOE_SHARED
from .config import ModelConfig

# logits rows (tokens) held at once: more are computed in slices of this many, each copied out
# before the next (a 248320-token vocabulary at -ub 2048 would otherwise take 2 GB of an 8 GB card)
LOGITS_ROWS = 64


def _table(cfg: ModelConfig, T: int, n_ctx: int, flash_attn: bool, device, embd_input: bool = False) -> dict:
    """name -> (type, ne, whether a model of `cfg` needs it) for T tokens (embd_input: steps may
    take input embeddings, an image's rows, instead of token ids)."""
    E, H, KV, Dk, Dv = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    D, Hv, C = cfg.ssm_head_dim, cfg.ssm_v_heads, cfg.ssm_conv_dim
    layers = cfg.layers
    kv = any(layer.has_kv for layer in layers)
    dn = bool(cfg.linear_layers)
    moe = any(layer.moe for layer in layers)
    shared = any(layer.ffn == MOE_SHARED for layer in layers)
    dense = any(layer.ffn == DENSE for layer in layers)
    k, fe, fs = cfg.n_expert_used, cfg.n_ff_expert, cfg.n_ff_shared
    work = delta_net_workspace_bytes(device, Hv, D, T, n_seqs=1) if dn else 0
    table = {
        # step inputs, written by the host each step
        "ids": (I32, (T,), True),                          # token ids
        "pos": (I32, (4 * T,), True),                      # positions (4 streams with sectioned RoPE)
        "cells": (I32, (T,), True),                        # KV cell of each token
        "slots": (I32, (T,), True),                        # recurrent-state slot of each sequence
        "mask": (F16, (n_ctx * T,), kv),                   # [n_kv, T]: 0 visible, -inf hidden
        "mask_swa": (F16, (n_ctx * T,), kv and bool(cfg.sliding_window)),
        "kv_used": (I32, (1,), kv and flash_attn),         # live KV cells (attention skips the rest)
        "mask_zero": (I32, (1,), kv and flash_attn),       # nonzero: the mask is 0 on every live cell
        "mask_swa_zero": (I32, (1,), kv and flash_attn and bool(cfg.sliding_window)),
        "out_ids": (I32, (T,), True),                      # the tokens whose logits a step computes
        "embd": (F32, (E, T), embd_input),                 # input embeddings (an image's rows) for x
        # residual stream and block buffers
        "x": (F32, (E, T), True),                          # residual stream
        "cur": (F32, (E, T), True),                        # normed block input
        "o": (F32, (E, T), True),                          # block output (added into x by the next norm)
        "logits": (F32, (cfg.vocab_size, min(T, LOGITS_ROWS)), True),
        # attention: roped q / k, attention output
        # q (| per-head gate), k, v projections: three contiguous [rows, tokens] one after another
        "qkv": (F32, (H * Dk * (2 if cfg.spec.attn.gate else 1) + KV * (Dk + Dv), T), kv),
        "qr": (F32, (H * Dk, T), kv),
        "kr": (F32, (KV * Dk, T), kv),
        "attn": (F32, (max(H * Dv if kv else 1, Hv * D if dn else 1), T), True),   # also the DeltaNet output
        "scores": (F32, (n_ctx * T * H,), kv and not flash_attn),
        # Gated DeltaNet
        "qkvz": (F32, (C + Hv * D, T), dn),                # attn_qkv projection (q, k, v heads), then attn_gate's
        "conv": (F32, (C, T), dn),                         # silu(conv1d(qkv)) with the conv state
        "ab": (F32, (2 * Hv, T), dn),                      # ssm_alpha projection (decay), then ssm_beta's
        "dn_norm": (F32, (Hv * D, T), dn),                 # rms_norm(out) * ssm_norm * silu(z)
        "dn_work": (F32, (max(work // 4, 1),), work > 0),  # the chunked delta rule's workspace
        # dense FFN
        "g": (F32, (cfg.n_ff, T), dense),                  # gate projection
        "u": (F32, (cfg.n_ff, T), dense),                  # up projection
        "h": (F32, (cfg.n_ff, T), dense),                  # act(g) * u
        # mixture of experts
        "router": (F32, (cfg.n_expert, T), moe),           # router logits
        "moe_w": (F32, (k, T), moe),                       # weights of the chosen experts
        "moe_ids": (I32, (k, T), moe),                     # chosen experts
        "moe_remap": (I32, (k, T), moe),                   # their staging slots
        "moe_plan": (I32, (plan_words(cfg.n_expert),), moe),
        "wg_count": (I32, (ROUTE_COUNTERS,), moe),         # the router mat-vec's finished workgroups, a counter
                                                           # a run (last_workgroup in mul_mv; 0 between)
        "ge": (F32, (fe, k, T), moe),                      # expert gate projections
        "ue": (F32, (fe, k, T), moe),                      # expert up projections
        "he": (F32, (fe, k, T), moe),                      # act(ge) * ue
        "de": (F32, (E, k, T), moe),                       # expert outputs
        "sg": (F32, (fs, T), shared),                      # shared expert gate
        "su": (F32, (fs, T), shared),                      # shared expert up
        "sh": (F32, (fs, T), shared),                      # act(sg) * su
        "sgate": (F32, (1, T), shared),                    # shared expert gate logit
    }
    return table


def scratch_shapes(cfg: ModelConfig, T: int, n_ctx: int, flash_attn: bool = True, device=None,
                   embd_input: bool = False) -> dict:
    """name -> (type, ne) of every activation a model of `cfg` needs for T tokens."""
    return {name: (typ, ne) for name, (typ, ne, needed)
            in _table(cfg, T, n_ctx, flash_attn, device, embd_input).items() if needed}


def scratch_bytes(cfg: ModelConfig, T: int, n_ctx: int, flash_attn: bool = True, device=None,
                  embd_input: bool = False) -> int:
    """Bytes of the activations (`device` is needed for models with DeltaNet layers: the size of
    the delta rule's workspace follows the device's tuning)."""
    shapes = scratch_shapes(cfg, T, n_ctx, flash_attn, device, embd_input)
    return sum(typ.type_size * math.prod(ne) for typ, ne in shapes.values())


class Scratch(Owned):
    """The activation tensors of `scratch_shapes` as attributes (None where the model has no
    use for one: no MoE, no DeltaNet layers, ...), the routing table of MoE prefill and the
    work buffers of flash attention and of GEMMs cut along K (`work`, grown by the recordings
    that need them)."""

    def __init__(self, device, cfg: ModelConfig, max_tokens: int, n_ctx: int, flash_attn: bool = True,
                 embd_input: bool = False):
        super().__init__(f"activations for {max_tokens} tokens")
        self.device, self.max_tokens, self.n_ctx = device, max_tokens, n_ctx
        self._mask_opt_owner: dict = {}
        self.routes: RouteTable | None = None
        self.work: FlashWork | None = None
        table = _table(cfg, max_tokens, n_ctx, flash_attn, device, embd_input)
        self._names = list(table)
        for name in self._names:
            setattr(self, name, None)
        try:
            for name, (typ, ne, needed) in table.items():
                if needed:
                    setattr(self, name, Tensor.empty(device, typ, ne, name=name))
            if self.router is not None:
                self.routes = RouteTable(device, cfg.n_expert, max_tokens)
                write_tensor(self.wg_count, np.zeros(ROUTE_COUNTERS, np.int32))
            self.work = FlashWork(device, label="step work")
        except BaseException:
            self.close()
            raise

    @property
    def mask_opt_owner(self) -> dict:
        """Per recording: mask -> the first FlashAttn that classified it (reset by
        Transformer.parts), whose mask_opt blocks the later layers read."""
        return self._mask_opt_owner

    def inputs(self) -> dict[str, Tensor]:
        """The step inputs the host writes: name -> tensor (absent ones left out)."""
        return {n: t for n in ("ids", "pos", "cells", "slots", "mask", "mask_swa", "kv_used", "mask_zero",
                                  "mask_swa_zero", "out_ids", "embd")
                if (t := getattr(self, n)) is not None}

    def cols(self, name: str, n: int, first: int = 0) -> Tensor:
        """Columns first..first+n-1 (tokens) of a 2-D activation."""
        return getattr(self, name).slice(1, first, first + n)

    def _release(self) -> None:
        for name in self._names:
            t = getattr(self, name, None)
            if t is not None:
                t.close()
        for obj in (self.routes, self.work):
            if obj is not None:
                obj.close()

