"""The decoder-only transformer of every supported architecture, recorded into a command
sequence for one batch shape. Weights are looked up by their GGUF names.

    x = token_embd[ids] (* sqrt(n_embd) for gemma3)
    per layer il ("blk.{il}."):
        cur = rms_norm(x) * attn_norm           (x += the previous block's output, fused in)
        q, k, v = attn_q·cur (+ bias), attn_k·cur, attn_v·cur
        q, k = rms_norm per head * attn_{q,k}_norm        (qwen3, gemma3)
        q, k = rope(q), rope(k)
        cache_k[cells], cache_v[cells] = k, v
        a = attention(q, cache_k[:n_kv], cache_v[:n_kv], mask)
        o = attn_output·a (post_attention_norm for gemma3)
        x = x + o;  cur = rms_norm(x) * ffn_norm  (one kernel; VKRT_FUSE_ADD_NORM=0: two)
        f = ffn_down·(act(ffn_gate·cur) * ffn_up·cur) (post_ffw_norm for gemma3)
    x = x + f (fused into the next norm);  logits = output·(rms_norm(x) * output_norm)
                                                         (output = token_embd when tied)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import GGUFError
from ..memory import F16, F32, I32, Tensor
from ..ops.attention import Attention
from ..ops.elementwise import activation, add, scale
from ..ops.flash_attn import FlashAttn
from ..ops.get_rows import get_rows
from ..ops.matmul import matmul
from ..ops.moe import moe_combine, moe_route
from ..ops.moe_stage import moe_stage_copy, moe_stage_plan, plan_words
from ..ops.mul_mat_id import RouteTable, mul_mat_id
from ..ops.norm import rms_norm
from ..ops.norm_rope import norm_rope
from ..ops.rope import rope
from ..ops.set_rows import set_rows
from ..owned import Owned
from .config import ROPE_NEOX, ModelConfig


def required_tensors(cfg: ModelConfig) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        names += [p + n for n in ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                  "attn_output.weight", "ffn_norm.weight")]
        if cfg.qk_norm:
            names += [p + "attn_q_norm.weight", p + "attn_k_norm.weight"]
        if cfg.post_norms:
            names += [p + "post_attention_norm.weight", p + "post_ffw_norm.weight"]
        if not cfg.moe:
            names += [p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight"]
        else:
            names += [p + "ffn_gate_inp.weight"] + [p + n for n in EXPERT_TENSORS]
            if cfg.n_ff_shared:
                names += [p + n for n in ("ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight",
                                          "ffn_up_shexp.weight", "ffn_down_shexp.weight")]
    return names


EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


# Lossless fusions and whether each is on by default: ADD_NORM (residual add inside the next RMS
# norm), NORM_ROPE (q/k norm + RoPE + K's cache store: 2 kernels instead of 5 a layer), GLU (the
# gated activation inside the down mat-vec). GLU is off: the fused mat-vec redoes the activation
# once per row group (M / mv_rows times per input), which cost more than the separate kernel it
# saves where the weights are in VRAM (H200, 8-layer 30B-A3B shape, decode: 639 us fused vs
# 507 us separate per step; bench/decode_profile.py).
FUSIONS = {"ADD_NORM": True, "GLU": False, "NORM_ROPE": True}


def fused(what: str) -> bool:
    """Whether the lossless fusion VKRT_FUSE_<what> is on: =1 / =0 force it, unset takes the
    default above (both settings give the same bits)."""
    value = os.environ.get(f"VKRT_FUSE_{what}", "")
    return FUSIONS[what] if value == "" else value != "0"


@dataclass
class StagedExperts:
    """Where a decode step of one host-resident MoE layer stages its chosen experts: per stack
    (gate, up, down) a slot tensor (K, M, n) or None (read in place); at most `max_copies`
    experts are copied per step; with `cache_slots` > 0 the first slots are the layer's expert
    cache (state in `state`) and staging slots start at `stage_base`."""

    stacks: tuple
    max_copies: int
    cache_slots: int = 0
    stage_base: int = 0
    state: Tensor | None = None


class Scratch(Owned):
    """Activations for up to `max_tokens` tokens, allocated once and reused by every layer."""

    def __init__(self, device, cfg: ModelConfig, max_tokens: int, n_ctx: int, flash_attn: bool = True):
        super().__init__(f"activations for {max_tokens} tokens")
        E, T = cfg.n_embd, max_tokens
        qd, kd, vd = cfg.n_head * cfg.head_dim_k, cfg.n_head_kv * cfg.head_dim_k, cfg.n_head_kv * cfg.head_dim_v
        ff = max(cfg.n_ff, 1)
        self.max_tokens, self.n_ctx = max_tokens, n_ctx
        self._mask_opt_owner: dict = {}
        self.pending: Tensor | None = None   # at record time: a block output not yet added into x
        shapes = dict(x=(E, T), cur=(E, T), q=(qd, T), k=(kd, T), v=(vd, T), qr=(qd, T), kr=(kd, T),
                      attn=(cfg.n_head * cfg.head_dim_v, T), o=(E, T), g=(ff, T), u=(ff, T), h=(ff, T),
                      logits=(cfg.vocab_size, T))
        self.t: dict[str, Tensor] = {}
        try:
            for name, ne in shapes.items():
                self.t[name] = Tensor.empty(device, F32, ne, name=name)
            for name in ("ids", "pos", "cells"):
                self.t[name] = Tensor.empty(device, I32, (T,), name=name)
            self.t["mask"] = Tensor.empty(device, F16, (n_ctx * T,), name="mask")
            if cfg.sliding_window:
                self.t["mask_swa"] = Tensor.empty(device, F16, (n_ctx * T,), name="mask_swa")
            if not flash_attn:  # scores of the non-flash path, shared by every layer
                self.t["scores"] = Tensor.empty(device, F32, (n_ctx * T * cfg.n_head,), name="scores")
            self.routes = None
            if cfg.moe:
                k, fe = cfg.n_expert_used, cfg.n_ff_expert
                for name, ne in dict(router=(cfg.n_expert, T), moe_w=(k, T), ge=(fe, k, T), ue=(fe, k, T),
                                     he=(fe, k, T), de=(E, k, T)).items():
                    self.t[name] = Tensor.empty(device, F32, ne, name=name)
                self.t["moe_ids"] = Tensor.empty(device, I32, (k, T), name="moe_ids")
                self.t["moe_remap"] = Tensor.empty(device, I32, (k, T), name="moe_remap")
                self.t["moe_plan"] = Tensor.empty(device, I32, (plan_words(cfg.n_expert),), name="moe_plan")
                if cfg.n_ff_shared:
                    for name, ne in dict(sg=(cfg.n_ff_shared, T), su=(cfg.n_ff_shared, T), sh=(cfg.n_ff_shared, T),
                                         sgate=(1, T)).items():
                        self.t[name] = Tensor.empty(device, F32, ne, name=name)
                self.routes = RouteTable(device, cfg.n_expert, T)
        except BaseException:
            self.close()
            raise

    @property
    def mask_opt_owner(self) -> dict:
        """Per recording: mask -> the first FlashAttn that classified it (reset by record())."""
        return self._mask_opt_owner

    def cols(self, name: str, n: int, first: int = 0) -> Tensor:
        """Columns first..first+n-1 (tokens) of a 2-D activation."""
        return self.t[name].slice(1, first, first + n)

    def _release(self) -> None:
        for t in self.t.values():
            t.close()
        if self.routes is not None:
            self.routes.close()


@dataclass
class Part:
    """A piece of the forward pass: record(seq) adds its commands and returns objects to keep
    alive. `layer` marks a MoE block whose experts come from a prefetch slot."""

    name: str
    fn: object
    layer: int | None = None

    def record(self, seq) -> list:
        out = self.fn(seq)
        return list(out) if isinstance(out, (list, tuple)) else []


@dataclass
class RecordOptions:
    n_tokens: int
    n_kv: int
    all_logits: bool
    flash_attn: bool = True


class Transformer:
    """Records the forward pass of `cfg` with `weights` (GGUF name -> Tensor)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, Tensor]):
        self.cfg = cfg
        self.w = weights
        missing = [n for n in required_tensors(cfg) if n not in weights]
        if missing:
            raise GGUFError(f"model lacks tensor(s) {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
        self.output = weights.get("output.weight", weights["token_embd.weight"])

    def record(self, seq, s: Scratch, cache, opts: RecordOptions) -> list[Owned]:
        """Record one forward pass into `seq`; returns the attention objects the recording uses
        (keep them alive as long as the sequence)."""
        keep: list[Owned] = []
        for part in self.parts(s, cache, opts):
            keep.extend(part.record(seq))
        return keep

    def parts(self, s: Scratch, cache, opts: RecordOptions, experts: dict | None = None,
              staged: dict | None = None) -> list["Part"]:
        """The forward pass as an ordered list of parts (embedding, per layer attention and FFN,
        output). `experts` maps a layer to the (gate, up, down) tensors to read instead of the
        model's; the engine cuts its command sequences before such layers' FFN parts. `staged`
        maps a layer to (gate, up, down) slot tensors: the chosen experts are copied there first."""
        cfg, T, n_kv = self.cfg, opts.n_tokens, opts.n_kv
        ids, pos, cells = (s.t[n].slice(0, 0, T) for n in ("ids", "pos", "cells"))
        masks = {False: s.t["mask"].slice(0, 0, n_kv * T).view((n_kv, T))}
        if cfg.sliding_window:
            masks[True] = s.t["mask_swa"].slice(0, 0, n_kv * T).view((n_kv, T))
        experts, staged = experts or {}, staged or {}
        s.mask_opt_owner.clear()
        parts = [Part("embed", lambda seq: self._embed(seq, s, ids, T))]
        for il in range(cfg.n_layer):
            mask = masks[cfg.layer_is_swa(il)]
            parts.append(Part(f"attention {il}", lambda seq, il=il, mask=mask: [
                self._attention(seq, s, cache, il, T, n_kv, pos, cells, mask, opts.flash_attn)]))
            if cfg.moe:
                parts.append(Part(f"moe {il}", lambda seq, il=il: self._moe(seq, s, il, T, experts.get(il),
                                                                          staged.get(il)),
                                  layer=il if il in experts else None))
            else:
                parts.append(Part(f"ffn {il}", lambda seq, il=il: self._ffn(seq, s, il, T)))
        parts.append(Part("output", lambda seq: self._output(seq, s, T, opts.all_logits)))
        return parts

    def _embed(self, seq, s, ids, T):
        s.pending = None
        x = s.cols("x", T)
        get_rows(seq, self.w["token_embd.weight"], ids, x)
        if self.cfg.embd_scale != 1.0:
            scale(seq, x, self.cfg.embd_scale, x)

    def _output(self, seq, s, T, all_logits):
        n_out = T if all_logits else 1
        normed = s.cols("cur", n_out, T - n_out)
        self._add_norm(seq, s, T, "output_norm.weight", first=T - n_out)
        matmul(seq, self.output, normed, s.cols("logits", n_out))

    def _norm(self, seq, src, dst, name):
        rms_norm(seq, src, dst, self.cfg.norm_eps, self.w[name])

    @staticmethod
    def _fuse_glu(seq, T) -> bool:
        """Decode-sized down projections take the gated activation inside their mat-vec."""
        return T <= seq.device.tuning.mv_max_n and fused("GLU")

    def _add_norm(self, seq, s, T, name, first: int = 0):
        """cur = rms_norm(x) * w[name] over columns first..T-1, after adding the pending block
        output into x (one fused kernel unless VKRT_FUSE_ADD_NORM=0)."""
        x, cur = s.cols("x", T - first, first), s.cols("cur", T - first, first)
        pending, s.pending = s.pending, None
        if pending is None:
            self._norm(seq, x, cur, name)
            return
        pending = pending.slice(1, first, T)
        if fused("ADD_NORM"):
            rms_norm(seq, x, cur, self.cfg.norm_eps, self.w[name], residual=pending, sum_out=x)
        else:
            add(seq, x, pending, x)
            self._norm(seq, x, cur, name)

    def _attention(self, seq, s, cache, il, T, n_kv, pos, cells, mask, flash):
        cfg, w, p = self.cfg, self.w, f"blk.{il}."
        D, Dv, H, KV = cfg.head_dim_k, cfg.head_dim_v, cfg.n_head, cfg.n_head_kv
        cur = s.cols("cur", T)
        self._add_norm(seq, s, T, p + "attn_norm.weight")
        q, k, v = s.cols("q", T), s.cols("k", T), s.cols("v", T)
        for t, name in ((q, "attn_q"), (k, "attn_k"), (v, "attn_v")):
            matmul(seq, w[p + name + ".weight"], cur, t)
            if cfg.attn_bias and p + name + ".bias" in w:
                add(seq, t, w[p + name + ".bias"], t)
        q3, k3 = q.view((D, H, T)), k.view((D, KV, T))
        qr, kr = s.cols("qr", T).view((D, H, T)), s.cols("kr", T).view((D, KV, T))
        rope_args = dict(n_dims=cfg.rope_dims, freq_base=cfg.layer_rope_base(il), freq_scale=cfg.rope_scale,
                         neox=cfg.rope_mode == ROPE_NEOX, freq_factors=w.get("rope_freqs.weight"))
        if fused("NORM_ROPE"):   # q/k norm, RoPE and K's store into the cache: two kernels
            norms = {n: w[p + f"attn_{n}_norm.weight"] if cfg.qk_norm else None for n in "qk"}
            norm_rope(seq, q3, pos, qr, weight=norms["q"], eps=cfg.norm_eps, **rope_args)
            norm_rope(seq, k3, pos, cache.k[il], weight=norms["k"], eps=cfg.norm_eps, rows=cells, **rope_args)
        else:
            if cfg.qk_norm:
                self._norm(seq, q3, q3, p + "attn_q_norm.weight")
                self._norm(seq, k3, k3, p + "attn_k_norm.weight")
            rope(seq, q3, pos, qr, **rope_args)
            rope(seq, k3, pos, kr, **rope_args)
            set_rows(seq, kr, cells, cache.k[il])
        set_rows(seq, v.view((Dv, KV, T)), cells, cache.v[il])
        out = s.cols("attn", T).view((Dv, H, T))
        args = (seq.device, qr.permute(0, 2, 1, 3), cache.k[il].slice(1, 0, n_kv), cache.v[il].slice(1, 0, n_kv),
                out, mask)
        if flash:  # layers attending through the same mask share one mask_opt pre-pass
            op = FlashAttn(*args, scale=cfg.attn_scale, label=f"flash attention {il}",
                           share_mask_opt=s.mask_opt_owner.get(id(mask)))
            s.mask_opt_owner.setdefault(id(mask), op)
        else:
            op = Attention(*args, scale=cfg.attn_scale, scores=s.t["scores"], label=f"attention {il}")
        op.record(seq)
        o = s.cols("o", T)
        matmul(seq, w[p + "attn_output.weight"], s.cols("attn", T), o)
        if cfg.post_norms:
            self._norm(seq, o, o, p + "post_attention_norm.weight")
        s.pending = o
        return op

    def _ffn(self, seq, s, il, T):
        cfg, w, p = self.cfg, self.w, f"blk.{il}."
        cur = s.cols("cur", T)
        self._add_norm(seq, s, T, p + "ffn_norm.weight")
        g, u, h, o = s.cols("g", T), s.cols("u", T), s.cols("h", T), s.cols("o", T)
        matmul(seq, w[p + "ffn_gate.weight"], cur, g)
        matmul(seq, w[p + "ffn_up.weight"], cur, u)
        if self._fuse_glu(seq, T):   # decode: the activation happens inside the down mat-vec
            matmul(seq, w[p + "ffn_down.weight"], g, o, up=u, act=cfg.activation)
        else:
            activation(seq, cfg.activation, g, h, up=u)
            matmul(seq, w[p + "ffn_down.weight"], h, o)
        if cfg.post_norms:
            self._norm(seq, o, o, p + "post_ffw_norm.weight")
        s.pending = o

    def _moe(self, seq, s, il, T, experts: tuple[Tensor, Tensor, Tensor] | None = None,
             staged: StagedExperts | None = None):
        """Routed experts (+ the gated shared expert of qwen2moe); `experts` overrides where the
        layer's expert tensors are read from (e.g. a prefetch slot); with `staged`, the chosen
        experts are first copied into those slot tensors and read from there."""
        cfg, w, p = self.cfg, self.w, f"blk.{il}."
        E, k = cfg.n_embd, cfg.n_expert_used
        cur = s.cols("cur", T)
        self._add_norm(seq, s, T, p + "ffn_norm.weight")
        router, ids, weights = s.cols("router", T), s.t["moe_ids"].slice(1, 0, T), s.t["moe_w"].slice(1, 0, T)
        matmul(seq, w[p + "ffn_gate_inp.weight"], cur, router)
        moe_route(seq, router, ids, weights, k, cfg.expert_weights_norm)
        gate, up, down = experts or tuple(w[p + n] for n in EXPERT_TENSORS)
        stacks = [(gate, ids), (up, ids), (down, ids)]
        if staged:
            remap, plan = s.t["moe_remap"].slice(1, 0, T), s.t["moe_plan"]
            moe_stage_plan(seq, ids, remap, plan, cfg.n_expert, state=staged.state, cache_slots=staged.cache_slots,
                           stage_base=staged.stage_base)
            for r, slots in enumerate(staged.stacks):
                if slots is not None:
                    moe_stage_copy(seq, stacks[r][0], slots, plan, staged.max_copies)
                    stacks[r] = (slots, remap)
        ge, ue, he, de = (s.t[n].slice(2, 0, T) for n in ("ge", "ue", "he", "de"))
        x3 = cur.view((E, 1, T))
        (gw, gi), (uw, ui), (dw, di) = stacks
        mul_mat_id(seq, gw, x3, gi, ge, s.routes)
        mul_mat_id(seq, uw, x3, ui, ue, s.routes)
        if self._fuse_glu(seq, T):
            mul_mat_id(seq, dw, ge, di, de, s.routes, up=ue, act="silu")
        else:
            activation(seq, "silu", ge, he, up=ue)
            mul_mat_id(seq, dw, he, di, de, s.routes)
        o = s.cols("o", T)
        shared = gate_logit = None
        if cfg.n_ff_shared:
            sg, su, sh = s.cols("sg", T), s.cols("su", T), s.cols("sh", T)
            matmul(seq, w[p + "ffn_gate_shexp.weight"], cur, sg)
            matmul(seq, w[p + "ffn_up_shexp.weight"], cur, su)
            shared = s.cols("o", T)
            if self._fuse_glu(seq, T):
                matmul(seq, w[p + "ffn_down_shexp.weight"], sg, shared, up=su, act="silu")
            else:
                activation(seq, "silu", sg, sh, up=su)
                matmul(seq, w[p + "ffn_down_shexp.weight"], sh, shared)
            gate_logit = s.cols("sgate", T)
            inp = w[p + "ffn_gate_inp_shexp.weight"]
            matmul(seq, inp.view((inp.ne[0], 1)), cur, gate_logit)
            o = cur  # the FFN input is no longer needed: the combined output goes there
        moe_combine(seq, de, weights, o, shared, gate_logit)
        s.pending = o
