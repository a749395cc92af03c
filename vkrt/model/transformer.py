"""The decoder-only transformer of every supported architecture, recorded into a command
sequence for one batch shape. Weights are looked up by their GGUF names; what each layer is
comes from the config's LayerSpecs (arch.py).

    x = token_embd[ids] (* sqrt(n_embd) for gemma3, * embedding_scale for granite)
    per layer il ("blk.{il}."):
        cur = rms_norm(x) * attn_norm           (x += the previous block's output, fused in)
        o = attention(cur)       full / sliding: attention_block.py; linear: delta_net_block.py
        x = x + o;  cur = rms_norm(x) * ffn_norm  (one kernel; VKRT_FUSE_ADD_NORM=0: two;
                                                   qwen35 names this norm post_attention_norm)
        f = ffn_down·(act(ffn_gate·cur) * ffn_up·cur)   or the routed experts (+ shared expert)
                                                 (post_ffw_norm for gemma3; gpt-oss: biases on
                                                 the router and each expert, swiglu_oai)
    x = x + f (fused into the next norm);  logits = output·(rms_norm(x) * output_norm)
                                                         (output = token_embd when tied)
    granite: o and f times residual_scale before they join x; logits divided by logit_scale
    or, for embeddings (RecordOptions.read_hidden), rms_norm(x) * output_norm of every token
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import GGUFError
from ..memory import Tensor
from ..ops.add_id import add_id
from ..ops.elementwise import activation, add, scale
from ..ops.get_rows import get_rows
from ..ops.matmul import NormInput, NormOutput, gate_up_pair, matmul, norm_input, norm_output_fits
from ..ops.moe import ExpertSum, moe_route, route_epilogue
from ..ops.moe_stage import moe_stage_copy, moe_stage_plan
from ..ops.mul_mat_id import mat_vec_tokens, mul_mat_id, mul_mat_id_sum
from ..ops.norm import rms_norm
from ..ops.quant import kernel_type
from ..settings import Settings
from .arch import DENSE, LINEAR, MOE_SHARED, SLIDING, Router
from .attention_block import record_attention
from .config import ModelConfig
from .delta_net_block import record_delta_net
from .fusions import Fusions
from .scratch import Scratch  # noqa: F401  (re-exported: the engine builds it)
from .tensors import EXPERT_TENSORS, LONG_ROPE_FACTORS, required_tensors



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


@dataclass
class Part:
    """A piece of the forward pass: record(seq) adds its commands (over tensors the Scratch,
    the caches and the weights own: nothing to keep alive). `layer` marks a MoE block whose
    experts come from a prefetch slot."""

    name: str
    fn: object
    layer: int | None = None

    def record(self, seq) -> None:
        self.fn(seq)


@dataclass
class RecordOptions:
    n_tokens: int
    n_kv: int
    all_logits: bool
    flash_attn: bool = True
    n_seqs: int = 1       # the tokens are n_seqs sequences of n_tokens / n_seqs consecutive tokens
    # read_logits(seq, n, row): record the copy of the n logits columns just computed (Scratch.logits
    # columns 0..n-1) to the caller's output rows row..row+n-1; None: computed, not read
    read_logits: object = None
    # > 0: logits of this many tokens, the ones the out_ids step input names (all_logits ignored)
    out_rows: int = 0
    # read_hidden(seq, cur): record the copy of every token's normed final state (cur, [n_embd,
    # n_tokens]: a decoder's embeddings) instead of computing logits; None: logits as above
    read_hidden: object = None
    # the layers recorded (a stage of a layer split; None: all); with `receive` the residual
    # stream x [n_embd, n_tokens] comes from receive(seq, x) instead of the embedding, with
    # `send` it goes to send(seq, x) (the pending block output added in) instead of the output
    layers: range | None = None
    receive: object = None
    send: object = None
    # > 0 (and not n_tokens): flash attention splits the KV cells as a step of this many tokens
    # would (a group of a pipelined step: the whole step's count), so each row sums them alike
    fa_plan_tokens: int = 0


def stored(seq, pending: "Tensor | ExpertSum") -> Tensor:
    """A pending block output as a tensor (an ExpertSum is summed into its `out` first)."""
    return pending.store(seq) if isinstance(pending, ExpertSum) else pending


class Transformer:
    """Records the forward pass of `cfg` with `weights` (GGUF name -> Tensor), using the lossless
    `fusions` (default: the declared defaults) and flash attention's mask_opt forced on or off by
    `fa_mask_opt` (None: the tuning rule); the engine passes its device's settings. `n_ctx_seq`:
    the context a sequence may fill, which picks LongRoPE's factors as llama.cpp does (phi3: long
    ones past rope.scaling.original_context_length, else short; rope_freqs.weight wins)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, Tensor], fusions: Fusions | None = None,
                 fa_mask_opt: bool | None = None, output: Tensor | None = None, n_ctx_seq: int = 0):
        self.cfg = cfg
        self.w = weights
        self.fusions = fusions if fusions is not None else Fusions.of(Settings())
        self.fa_mask_opt = fa_mask_opt
        missing = [n for n in required_tensors(cfg, graph=True) if n not in weights]
        if missing:
            raise GGUFError(f"model lacks tensor(s) {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
        # `output`: the output matrix where it is not the file's (tied embeddings on a split's main device)
        self.output = output or weights.get("output.weight", weights["token_embd.weight"])
        factors = "rope_freqs.weight"
        if factors not in weights and cfg.spec.rope.long_rope:
            factors = LONG_ROPE_FACTORS[0] if n_ctx_seq > cfg.n_ctx_orig_yarn else LONG_ROPE_FACTORS[1]
        self.rope_factors = weights.get(factors)

    def record(self, seq, s: Scratch, cache, opts: RecordOptions, state=None) -> None:
        """Record one forward pass into `seq`."""
        for part in self.parts(s, cache, opts, state=state):
            part.record(seq)

    def parts(self, s: Scratch, cache, opts: RecordOptions, experts: dict | None = None,
              staged: dict | None = None, state=None) -> list["Part"]:
        """The forward pass as an ordered list of parts (embedding, per layer attention and FFN,
        output). `cache` is the KV cache, `state` the recurrent state of the DeltaNet layers.
        `experts` maps a layer to the (gate, up, down) tensors to read instead of the model's;
        the engine cuts its command sequences before such layers' FFN parts. `staged` maps a
        layer to (gate, up, down) slot tensors: the chosen experts are copied there first."""
        cfg, T, n_kv = self.cfg, opts.n_tokens, opts.n_kv
        masks = {}
        if s.mask is not None:
            masks[False] = s.mask.slice(0, 0, n_kv * T).view((n_kv, T))
        if s.mask_swa is not None:
            masks[True] = s.mask_swa.slice(0, 0, n_kv * T).view((n_kv, T))
        plan = opts.fa_plan_tokens if opts.flash_attn and opts.fa_plan_tokens not in (0, T) else 0
        plan_masks = {swa: (s.mask_swa if swa else s.mask).slice(0, 0, n_kv * plan).view((n_kv, plan))
                      for swa in masks} if plan else {}
        experts, staged = experts or {}, staged or {}
        s.mask_opt_owner.clear()
        layers = opts.layers if opts.layers is not None else range(cfg.n_layer)
        follows = [f"blk.{il}.attn_norm.weight" for il in layers[1:]]
        follows.append("output_norm.weight" if opts.send is None else None)
        s.next_norm = dict(zip(layers, follows))
        if opts.receive is None:
            parts = [Part("embed", lambda seq: self._embed(seq, s, T))]
        else:
            parts = [Part("receive", lambda seq: self._receive(seq, s, T, opts))]
        for il in layers:
            layer = cfg.layers[il]
            if layer.attn == LINEAR:
                parts.append(Part(f"delta net {il}", lambda seq, il=il: record_delta_net(
                    self, seq, s, state, il, T, opts.n_seqs)))
            else:
                swa = layer.attn == SLIDING
                split_as = (plan, plan_masks[swa]) if plan else None
                parts.append(Part(f"attention {il}", lambda seq, il=il, mask=masks[swa], split_as=split_as:
                                  record_attention(self, seq, s, cache, il, T, n_kv, mask, opts.flash_attn, split_as)))
            if layer.ffn == DENSE:
                parts.append(Part(f"ffn {il}", lambda seq, il=il: self._ffn(seq, s, il, T)))
            else:
                parts.append(Part(f"moe {il}", lambda seq, il=il: self._moe(seq, s, il, T, experts.get(il),
                                                                          staged.get(il)),
                                  layer=il if il in experts else None))
        if opts.send is None:
            parts.append(Part("output", lambda seq: self._output(seq, s, T, opts)))
        else:
            parts.append(Part("send", lambda seq: self._send(seq, s, T, opts)))
        return parts

    @staticmethod
    def _receive(seq, s, T, opts: RecordOptions):
        s.pending = s.normed = None
        opts.receive(seq, s.cols("x", T))

    @staticmethod
    def _send(seq, s, T, opts: RecordOptions):
        x, pending, s.pending = s.cols("x", T), s.pending, None
        if pending is not None:   # as the next norm would add it (bit-identical: VKRT_FUSE_ADD_NORM)
            add(seq, x, stored(seq, pending), x)
        opts.send(seq, x)

    def _embed(self, seq, s, T):
        s.pending = s.normed = None
        x = s.cols("x", T)
        get_rows(seq, self.w["token_embd.weight"], s.ids.slice(0, 0, T), x)
        if self.cfg.embd_scale != 1.0:
            scale(seq, x, self.cfg.embd_scale, x)

    def _output(self, seq, s, T, opts: RecordOptions):
        if opts.read_hidden is not None:   # embeddings: no output matrix
            self.add_norm(seq, s, T, "output_norm.weight")
            opts.read_hidden(seq, s.cols("cur", T))
            return
        if opts.out_rows:   # the chosen tokens' normed states, gathered into x (no longer needed)
            self.add_norm(seq, s, T, "output_norm.weight")
            src, first, last = "x", 0, opts.out_rows
            get_rows(seq, s.cols("cur", T), s.out_ids.slice(0, 0, last), s.cols(src, last))
        else:
            src, first, last = "cur", T - (T if opts.all_logits else 1), T
            self.add_norm(seq, s, T, "output_norm.weight", first=first)
        rows = s.logits.ne[1]
        for c in range(first, last, rows):   # slices of the logits buffer's width
            n = min(rows, last - c)
            # every slice takes the kernel of the whole: a row's logits do not depend on the slice
            matmul(seq, self.output, s.cols(src, n, c), s.cols("logits", n), kernel_columns=last - first)
            if self.cfg.logit_scale != 1.0:   # as ggml_scale by the float32 reciprocal
                inv = float(np.float32(1.0) / np.float32(self.cfg.logit_scale))
                scale(seq, s.cols("logits", n), inv, s.cols("logits", n))
            if opts.read_logits is not None:
                opts.read_logits(seq, n, c - first)

    def block_output(self, seq, s, o):
        """o joins the residual stream at the next norm (granite: times residual_scale first)."""
        if self.cfg.residual_scale:
            scale(seq, o, self.cfg.residual_scale, o)
        s.pending, s.normed = o, None

    def norm(self, seq, src, dst, name):
        rms_norm(seq, src, dst, self.cfg.norm_eps, self.w[name])

    @staticmethod
    def _fused_max(seq, dense: bool) -> int:
        """The most tokens a fused mat-vec takes: a dense one's columns (mv_dense_max_n: its
        registers grow with them), mul_mat_id's one column a (token, slot) pair (as many as it
        runs as mat-vecs: mat_vec_tokens)."""
        tuning = seq.device.tuning
        return min(tuning.mv_dense_max_n, tuning.mv_max_n) if dense else mat_vec_tokens(tuning)

    def _fuse_glu(self, seq, T, dense: bool = True) -> bool:
        """Decode-sized down projections take the gated activation inside their mat-vec."""
        return T <= self._fused_max(seq, dense) and self.fusions.glu

    def _fuse_gate_up(self, seq, T, gate: Tensor, up: Tensor, act: str, dense: bool = True) -> bool:
        """Decode-sized gate and up projections run as one pass where their weights allow it."""
        return (T <= self._fused_max(seq, dense) and self.fusions.gate_up
                and gate_up_pair(gate, up, seq.device, act) is not None)

    def _gated_ffn(self, seq, T, gate, up, down, cur, g, u, h, o, act):
        """o = down·(act(gate·cur) * (up·cur)) through the fused passes that apply."""
        if self._fuse_gate_up(seq, T, gate, up, act):
            matmul(seq, gate, cur, h, up_weight=up, act=act)
            matmul(seq, down, h, o)
            return
        matmul(seq, gate, cur, g)
        matmul(seq, up, cur, u)
        if self._fuse_glu(seq, T):   # decode: the activation happens inside the down mat-vec
            matmul(seq, down, g, o, up=u, act=act)
        else:
            activation(seq, act, g, h, up=u)
            matmul(seq, down, h, o)

    def add_norm(self, seq, s, T, name, first: int = 0):
        """cur = rms_norm(x) * w[name] over columns first..T-1, after adding the pending block
        output into x (one fused kernel unless fusions.add_norm is off; a MoE block's output may
        still be its experts' unsummed outputs, an ExpertSum, summed by that kernel)."""
        x, cur = s.cols("x", T - first, first), s.cols("cur", T - first, first)
        pending, s.pending = s.pending, None
        normed, s.normed = s.normed, None
        if pending is None and normed == name:   # done by the summed down projection (VKRT_FUSE_RESID_NORM)
            return
        if pending is None:
            self.norm(seq, x, cur, name)
            return
        pending = pending.slice(1, first, T)
        if self.fusions.add_norm:
            rms_norm(seq, x, cur, self.cfg.norm_eps, self.w[name], residual=pending, sum_out=x)
        else:
            add(seq, x, stored(seq, pending), x)
            self.norm(seq, x, cur, name)

    def _resid_norm(self, seq, s, T, il, down: Tensor) -> tuple[str, NormOutput] | None:
        """(the next block's norm weight name, its NormOutput) where a MoE block's summed down
        projection adds the sum into the residual stream and its last workgroup does the next
        block's RMS norm into cur (VKRT_FUSE_RESID_NORM): decode sizes, no residual scale, experts
        without a down bias and no shared expert (the sum would wait for its down projection: a
        stage between the experts' and the sum, as many stages as the norm's it saves), and a
        summed down projection (`down`: the stack it reads) that takes a token's slots at once
        (norm_output_fits). The next norm is the next recorded layer's attn_norm or the output's
        (none where the stream goes to another device); add_norm finds it done (s.normed)."""
        cfg = self.cfg
        if not self.fusions.resid_norm or cfg.residual_scale or cfg.spec.moe.expert_bias or cfg.layers[il].ffn == MOE_SHARED:
            return None
        name = s.next_norm.get(il)   # none across a layer split's devices
        if name is None or name not in self.w or s.wg_count is None or not norm_output_fits(
                seq.device, down.ne[1], cfg.n_expert_used, kernel_type(down.type, "expert down weight"), down.ne[0]):
            return None
        return name, NormOutput(self.w[name], self.cfg.norm_eps, s.cols("cur", T), s.wg_count)

    def _router_norm(self, seq, s, T, name) -> NormInput | None:
        """The add and norm before a MoE block (add_norm's) as the prologue of its router's mat-vec
        (VKRT_FUSE_NORM_ROUTE; matmul's norm_in), the pending block output consumed; None where it
        cannot be (see norm_input; a MoE block's unsummed experts are left to the norm)."""
        pending = s.pending
        if not self.fusions.norm_route or pending is None or isinstance(pending, ExpertSum):
            return None
        norm_in = norm_input(seq, s.cols("x", T), pending, self.w[name], self.cfg.norm_eps, s.cols("cur", T))
        if norm_in is not None:
            s.pending = None
        return norm_in

    def _ffn(self, seq, s, il, T):
        cfg, w, p = self.cfg, self.w, f"blk.{il}."
        cur = s.cols("cur", T)
        self.add_norm(seq, s, T, p + cfg.spec.norms.ffn + ".weight")
        g, u, h, o = s.cols("g", T), s.cols("u", T), s.cols("h", T), s.cols("o", T)
        self._gated_ffn(seq, T, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"], cur,
                        g, u, h, o, cfg.spec.ffn.activation)
        if cfg.spec.norms.post:
            self.norm(seq, o, o, p + "post_ffw_norm.weight")
        self.block_output(seq, s, o)

    @staticmethod
    def _experts(seq, s, w, x, sid, y, bias, ids, held):
        """y = w[sid]·x (+ bias[:, ids], gpt-oss): the bias added in the mat-vec where sid are the
        experts' own ids, by add_id after it where they are staging slots. `held`: the ids whose
        routes s.routes holds from an earlier GEMM of the block (gate, up and down share one
        counting pass); returns the ids it holds after this call (None: none)."""
        counted = held is sid
        if bias is None or sid is ids:
            filled = mul_mat_id(seq, w, x, sid, y, s.routes, bias=bias, routes_counted=counted)
        else:
            filled = mul_mat_id(seq, w, x, sid, y, s.routes, routes_counted=counted)
            add_id(seq, y, bias, ids, y)
        return sid if filled else None

    def _moe(self, seq, s, il, T, experts: tuple[Tensor, Tensor, Tensor] | None = None,
             staged: StagedExperts | None = None):
        """Routed experts (+ the shared expert: sigmoid-gated in qwen2moe / qwen35moe, added as it
        is in granitemoe and glm4moe; gpt-oss's router and expert biases; glm4moe's sigmoid router); `experts` overrides where the
        layer's expert tensors are read from (e.g. a prefetch slot); with `staged`, the chosen
        experts are first copied into those slot tensors and read from there. The biases stay in VRAM, read by the experts' own ids."""
        cfg, w, p = self.cfg, self.w, f"blk.{il}."
        E, k, act = cfg.n_embd, cfg.n_expert_used, cfg.spec.ffn.activation
        cur = s.cols("cur", T)
        norm_name = p + cfg.spec.norms.ffn + ".weight"
        router, ids, weights = s.cols("router", T), s.moe_ids.slice(1, 0, T), s.moe_w.slice(1, 0, T)
        gate_inp = w[p + "ffn_gate_inp.weight"]
        gating = dict(chosen_softmax=cfg.spec.moe.router is Router.CHOSEN_SOFTMAX,
                      sigmoid_bias=w[p + "exp_probs_b.bias"] if cfg.spec.moe.router is Router.SIGMOID else None)
        route = None   # routed in the router's mat-vec (VKRT_FUSE_ROUTE) where it can be
        if self.fusions.route and not cfg.spec.moe.router_bias:
            route = route_epilogue(seq, gate_inp, router, ids, weights, k, cfg.expert_weights_norm, s.wg_count,
                                   **gating)
        norm_in = self._router_norm(seq, s, T, norm_name) if route is not None else None
        if norm_in is None:
            self.add_norm(seq, s, T, norm_name)
        matmul(seq, gate_inp, cur, router, route=route, norm_in=norm_in)
        if route is None:
            if cfg.spec.moe.router_bias:
                add(seq, router, w[p + "ffn_gate_inp.bias"], router)
            moe_route(seq, router, ids, weights, k, cfg.expert_weights_norm, **gating)
        if cfg.expert_weights_scale not in (0.0, 1.0):   # glm4moe's routed_scaling_factor
            scale(seq, weights, cfg.expert_weights_scale, weights)
        gate, up, down = experts or tuple(w[p + n] for n in EXPERT_TENSORS)
        stacks = [(gate, ids), (up, ids), (down, ids)]
        if staged:
            remap, plan = s.moe_remap.slice(1, 0, T), s.moe_plan
            moe_stage_plan(seq, ids, remap, plan, cfg.n_expert, state=staged.state, cache_slots=staged.cache_slots,
                           stage_base=staged.stage_base)
            for r, slots in enumerate(staged.stacks):
                if slots is not None:
                    moe_stage_copy(seq, stacks[r][0], slots, plan, staged.max_copies)
                    stacks[r] = (slots, remap)
        ge, ue, he, de = (getattr(s, n).slice(2, 0, T) for n in ("ge", "ue", "he", "de"))
        x3 = cur.view((E, 1, T))
        (gw, gi), (uw, ui), (dw, di) = stacks
        bg, bu, bd = (w[p + f"ffn_{n}_exps.bias"] if cfg.spec.moe.expert_bias else None for n in ("gate", "up", "down"))

        def own(sid):   # a mat-vec adds the experts' biases where it reads by their own ids
            return bg is None or sid is ids

        # the summed down projection has no place for the experts' biases: gpt-oss sums apart
        decode = T <= mat_vec_tokens(seq.device.tuning)
        resid = self._resid_norm(seq, s, T, il, dw) if decode else None
        summed = decode and (self.fusions.moe_sum or resid is not None) and bd is None
        down_in = he   # the routed experts' activations; None: the down projection already ran (GLU)
        held = None   # the ids whose routes s.routes holds from an earlier GEMM of this block
        if gi is ui and own(gi) and self._fuse_gate_up(seq, T, gw, uw, act, dense=False):
            mul_mat_id(seq, gw, x3, gi, he, s.routes, up_weight=uw, act=act, bias=bg, up_bias=bu)
        else:
            held = self._experts(seq, s, gw, x3, gi, ge, bg, ids, held)
            held = self._experts(seq, s, uw, x3, ui, ue, bu, ids, held)
            if self._fuse_glu(seq, T, dense=False) and not summed and own(di):
                mul_mat_id(seq, dw, ge, di, de, s.routes, up=ue, act=act, bias=bd)
                down_in = None
            else:
                activation(seq, act, ge, he, up=ue)
        o = s.cols("o", T)
        shared = gate_logit = None
        if cfg.layers[il].ffn == MOE_SHARED:
            sg, su, sh = s.cols("sg", T), s.cols("su", T), s.cols("sh", T)
            shared = s.cols("o", T)
            self._gated_ffn(seq, T, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"],
                            w[p + "ffn_down_shexp.weight"], cur, sg, su, sh, shared, "silu")
            if cfg.spec.moe.shared_gate:
                gate_logit = s.cols("sgate", T)
                inp = w[p + "ffn_gate_inp_shexp.weight"]
                matmul(seq, inp.view((inp.ne[0], 1)), cur, gate_logit)
            o = cur  # the FFN input is no longer needed: the combined output goes there
        ungated = None
        if shared is not None and gate_logit is None:   # added after the routed experts' sum
            shared, ungated = None, shared
        if down_in is not None and summed and resid is not None and mul_mat_id_sum(
                seq, dw, down_in, di, weights, s.cols("x", T), shared, gate_logit, residual=True, norm=resid[1]):
            s.normed = resid[0]   # the residual stream holds the block's output, cur its next norm
            return
        if not (down_in is not None and summed
                and mul_mat_id_sum(seq, dw, down_in, di, weights, o, shared, gate_logit)):
            if down_in is not None:
                self._experts(seq, s, dw, down_in, di, de, bd, ids, held)
            total = ExpertSum(de, weights, o, shared, gate_logit)
            if ungated is None and not cfg.residual_scale and self.fusions.combine_norm and self.fusions.add_norm:
                s.pending = total   # summed by the next norm (VKRT_FUSE_COMBINE_NORM)
                return
            total.store(seq)
        if ungated is not None:
            add(seq, o, ungated, o)
        self.block_output(seq, s, o)
