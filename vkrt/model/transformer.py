"""The decoder-only transformer of every supported architecture, recorded into a command
sequence for one batch shape. Weights are looked up by their GGUF names; what each layer is
comes from the config's LayerSpecs (arch.py).

    x = token_embd[ids] (* sqrt(n_embd) for gemma3, * embedding_scale for granite)
    per layer il ("blk.{il}."):
        x = x + o;  cur = rms_norm(x) * attn_norm      (o: the previous block's output)
        o = attention(cur)       full / sliding: attention_block.py; linear: delta_net_block.py
        x = x + o;  cur = rms_norm(x) * ffn_norm   (qwen35 names this norm post_attention_norm)
        f = ffn_down·(act(ffn_gate·cur) * ffn_up·cur)   or the routed experts (+ shared expert)
                                                 (post_ffw_norm for gemma3; gpt-oss: biases on
                                                 the router and each expert, swiglu_oai)
    x = x + f;  logits = output·(rms_norm(x) * output_norm)
                                                         (output = token_embd when tied)
    granite: o and f times residual_scale before they join x; logits divided by logit_scale
    or, for embeddings (RecordOptions.read_hidden), rms_norm(x) * output_norm of every token

The model code emits plain ops (nodes.py) into a Graph; the fusion pass (fuse.py) rewrites them
into fused kernels before they are recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import GGUFError
from ..memory import Tensor
from ..ops.elementwise import add, scale
from ..ops.get_rows import get_rows
from ..ops.moe_stage import moe_stage_copy, moe_stage_plan
from ..ops.norm import rms_norm
from .arch import DENSE, LINEAR, MOE_SHARED, SLIDING, Router
from .attention_block import record_attention
from .config import ModelConfig
from .delta_net_block import record_delta_net
from .fuse import ALL, fuse
from .graph import Graph
from .mtp import EH_PROJ, ENORM, HNORM, MTP_CONCAT, MTP_HIDDEN
from .nodes import Glu, MoeCombine, MulMatId, Route, RouteCount
from .scratch import Scratch  # noqa: F401  (re-exported: the engine builds it)
from .tensors import EXPERT_TENSORS, LONG_ROPE_FACTORS, required_tensors


@dataclass
class HostExchange:
    """Where a step of one host-resident MoE layer meets the host, which plans its experts and
    computes some on the CPU. The GPU writes `x` (the FFN input, [n_embd, T]), `ids` and
    `weights` (the routing, [k, T]); the host writes `remap` (each pair's slot), `gpu_weights`
    (the routing weights the GPU sums with: 0 for the pairs the CPU computes), `plan` (the
    copies, as moe_stage_plan writes them) and `cpu_sum` (the CPU's weighted expert sum,
    [n_embd, T]). Host-visible tensors of the most tokens a step stages, sliced to T."""

    x: Tensor
    ids: Tensor
    weights: Tensor
    remap: Tensor
    gpu_weights: Tensor
    plan: Tensor
    cpu_sum: Tensor


@dataclass
class StagedExperts:
    """Where a decode step of one host-resident MoE layer stages its chosen experts: per stack
    (gate, up, down) a slot tensor (K, M, n) or None (read in place); at most `max_copies`
    experts are copied per step; with `cache_slots` > 0 the first slots are the layer's expert
    cache (state in `state`) and staging slots start at `stage_base`. With `host` the host
    plans the copies (and the cache) and computes some experts on the CPU: the step is cut
    after the routing (the host reads it) and before the block output joins the residual
    stream (the CPU's sum is added)."""

    stacks: tuple
    max_copies: int
    cache_slots: int = 0
    stage_base: int = 0
    state: Tensor | None = None
    host: HostExchange | None = None
    routes: object = None   # the RouteTable of a step of more than mv_max_n tokens over these slots


@dataclass
class Part:
    """A piece of the forward pass: record(seq) adds its ops' commands (over tensors the Scratch,
    the caches and the weights own: nothing to keep alive). `layer` marks a MoE block whose
    experts come from a prefetch slot; `host` = (what, layer) marks a part the host works before
    (("plan", il): the staging plan of layer il's experts; ("cpu", il): its CPU experts).
    Both start a command sequence of their own."""

    name: str
    layer: int | None = None
    nodes: list = field(default_factory=list)
    host: tuple[str, int] | None = None

    def record(self, seq) -> None:
        for node in self.nodes:
            node.record(seq)


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
    # keep_hidden(seq, cur): record the copy of every token's normed final state (cur) and
    # compute the logits as above as well (what an MTP head reads); None: not kept
    keep_hidden: object = None
    # > 0 (and not n_tokens): flash attention splits the KV cells as a step of this many tokens
    # would (a group of a pipelined step: the whole step's count), so each row sums them alike
    fa_plan_tokens: int = 0
    # the residual stream starts as the input embeddings the host wrote (Scratch.embd: an image's
    # rows), not the token ids' embeddings
    embd: bool = False


class Transformer:
    """Records the forward pass of `cfg` with `weights` (GGUF name -> Tensor), with the fusions
    `fusions` (names of fuse.FUSIONS; default all) and flash attention's mask_opt forced on or off
    by `fa_mask_opt` (None: the tuning rule); the engine passes its device's settings.
    `n_ctx_seq`: the context a sequence may fill, which picks LongRoPE's factors as llama.cpp
    does (phi3: long ones past rope.scaling.original_context_length, else short; rope_freqs.weight
    wins)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, Tensor], fusions: frozenset[str] = ALL,
                 fa_mask_opt: bool | None = None, output: Tensor | None = None, n_ctx_seq: int = 0):
        self.cfg = cfg
        self.w = weights
        self.fusions = fusions
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
              staged: dict | None = None, state=None) -> list[Part]:
        """The forward pass as an ordered list of parts (embedding, per layer attention and FFN,
        output), fused. `cache` is the KV cache, `state` the recurrent state of the DeltaNet
        layers. `experts` maps a layer to the (gate, up, down) tensors to read instead of the
        model's; the engine cuts its command sequences before such layers' FFN parts. `staged`
        maps a layer to a StagedExperts: the chosen experts are copied there first."""
        cfg, T, n_kv = self.cfg, opts.n_tokens, opts.n_kv
        masks = {}
        if s.mask is not None:   # (the mask, the word flagging a step's mask all zero on its live cells)
            masks[False] = (s.mask.slice(0, 0, n_kv * T).view((n_kv, T)), s.mask_zero)
        if s.mask_swa is not None:
            masks[True] = (s.mask_swa.slice(0, 0, n_kv * T).view((n_kv, T)), s.mask_swa_zero)
        plan = opts.fa_plan_tokens if opts.flash_attn and opts.fa_plan_tokens not in (0, T) else 0
        plan_masks = {swa: (s.mask_swa if swa else s.mask).slice(0, 0, n_kv * plan).view((n_kv, plan))
                      for swa in masks} if plan else {}
        experts, staged = experts or {}, staged or {}
        s.mask_opt_owner.clear()
        g, parts = Graph(s, T), []

        def part(name: str, layer: int | None = None, host: tuple[str, int] | None = None) -> None:
            g.part = len(parts)
            if layer is not None or host is not None:
                g.segment += 1
            parts.append(Part(name, layer, host=host))
        self._cut = part

        if opts.receive is None:
            part("embed")
            if opts.embd:
                rows = s.cols("embd", T)
                g.call("input embeddings", lambda seq: seq.copy(rows.range(), g.x.range(), rows.nbytes))
                if "blk.0." + EH_PROJ in self.w:   # an MTP head: the rows stand for the next tokens' embeddings
                    self._mtp_input(g)
            else:
                self._embed(g)
        else:
            part("receive")
            g.call("receive", lambda seq: opts.receive(seq, g.x))
        for il in (opts.layers if opts.layers is not None else range(cfg.n_layer)):
            layer = cfg.layers[il]
            if layer.attn == LINEAR:
                part(f"delta net {il}")
                record_delta_net(self, g, state, il, opts.n_seqs)
            else:
                swa = layer.attn == SLIDING
                part(f"attention {il}")
                record_attention(self, g, cache, il, n_kv, *masks[swa], opts.flash_attn,
                                 (plan, plan_masks[swa]) if plan else None)
            if layer.ffn == DENSE:
                part(f"ffn {il}")
                self._ffn(g, il)
            else:
                part(f"moe {il}", il if il in experts else None)
                self._moe(g, il, experts.get(il), staged.get(il))
        if opts.send is None:
            part("output")
            self._output(g, opts)
        else:
            part("send")
            g.add_pending()
            g.call("send", lambda seq: opts.send(seq, g.x))
        for node in fuse(g.nodes, s.device, self.fusions, s.wg_count):
            parts[node.part].nodes.append(node)
        return parts

    def _embed(self, g: Graph) -> None:
        x, table = g.x, self.w["token_embd.weight"]
        ids = g.s.ids.slice(0, 0, g.T)
        g.call("embed", lambda seq: get_rows(seq, table, ids, x))
        if self.cfg.embd_scale != 1.0:
            g.call("embed scale", lambda seq: scale(seq, x, self.cfg.embd_scale, x))
        if "blk.0." + EH_PROJ in self.w:
            self._mtp_input(g)

    def _mtp_input(self, g: Graph) -> None:
        """An MTP head's input (mtp.py): x = eh_proj · [rms_norm(x) * enorm ; rms_norm(h) * hnorm],
        h the trunk's states the host wrote to MTP_HIDDEN, the concatenation in MTP_CONCAT."""
        w, E, T, eps, x = self.w, self.cfg.n_embd, g.T, self.cfg.norm_eps, g.x
        c, h = w[MTP_CONCAT].slice(1, 0, T), w[MTP_HIDDEN].slice(1, 0, T)
        halves = [c.view((E, T), nb=(4, c.nb[1]), offset=k * 4 * E) for k in (0, 1)]
        g.call("mtp enorm", lambda seq: rms_norm(seq, x, halves[0], eps, w["blk.0." + ENORM]))
        g.call("mtp hnorm", lambda seq: rms_norm(seq, h, halves[1], eps, w["blk.0." + HNORM]))
        g.matmul(w["blk.0." + EH_PROJ], c, x)

    def _output(self, g: Graph, opts: RecordOptions) -> None:
        s, T, norm = g.s, g.T, self.w["output_norm.weight"]
        eps = self.cfg.norm_eps
        if opts.read_hidden is not None:   # embeddings: no output matrix
            cur = g.residual_norm(norm, eps)
            g.call("read hidden", lambda seq: opts.read_hidden(seq, cur))
            return
        if opts.keep_hidden is not None:   # every token's normed state, read back, then the logits
            cur = g.residual_norm(norm, eps)
            g.call("keep hidden", lambda seq: opts.keep_hidden(seq, cur))
        if opts.out_rows:   # the chosen tokens' normed states, gathered into x (no longer needed)
            cur = g.cur if opts.keep_hidden is not None else g.residual_norm(norm, eps)
            src, first, last = "x", 0, opts.out_rows
            rows_of = s.cols(src, last)
            g.call("out rows", lambda seq: get_rows(seq, cur, s.out_ids.slice(0, 0, last), rows_of))
        else:
            src, first, last = "cur", T - (T if opts.all_logits else 1), T
            if opts.keep_hidden is None:
                g.residual_norm(norm, eps, first)
        rows = s.logits.ne[1]
        for c in range(first, last, rows):   # slices of the logits buffer's width
            n = min(rows, last - c)
            logits = s.cols("logits", n)
            # every slice takes the kernel of the whole: a row's logits do not depend on the slice
            g.matmul(self.output, s.cols(src, n, c), logits, kernel_columns=last - first)
            if self.cfg.logit_scale != 1.0:   # as ggml_scale by the float32 reciprocal
                inv = float(np.float32(1.0) / np.float32(self.cfg.logit_scale))
                g.call("logit scale", lambda seq, t=logits: scale(seq, t, inv, t))
            if opts.read_logits is not None:
                g.call("read logits", lambda seq, n=n, row=c - first: opts.read_logits(seq, n, row))

    def block_output(self, g: Graph, o: Tensor) -> None:
        """o joins the residual stream at the next norm (granite: times residual_scale first)."""
        if self.cfg.residual_scale:
            g.call("residual scale", lambda seq: scale(seq, o, self.cfg.residual_scale, o))
        g.join(o)

    @staticmethod
    def _gated_ffn(g: Graph, gate, up, down, cur, gt, u, h, o, act) -> None:
        """o = down·(act(gate·cur) * (up·cur))."""
        g.matmul(gate, cur, gt)
        g.matmul(up, cur, u)
        g.add(Glu(act, gt, u, h))
        g.matmul(down, h, o)

    def _ffn(self, g: Graph, il: int) -> None:
        cfg, w, p, s, T = self.cfg, self.w, f"blk.{il}.", g.s, g.T
        cur = g.residual_norm(w[p + cfg.spec.norms.ffn + ".weight"], cfg.norm_eps)
        o = s.cols("o", T)
        self._gated_ffn(g, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"], cur,
                        s.cols("g", T), s.cols("u", T), s.cols("h", T), o, cfg.spec.ffn.activation)
        if cfg.spec.norms.post:
            g.norm(o, o, w[p + "post_ffw_norm.weight"], cfg.norm_eps)
        self.block_output(g, o)

    def _moe(self, g: Graph, il: int, experts: tuple[Tensor, Tensor, Tensor] | None = None,
             staged: StagedExperts | None = None) -> None:
        """Routed experts (+ the shared expert: sigmoid-gated in qwen2moe / qwen35moe, added as it
        is in granitemoe and glm4moe; gpt-oss's router and expert biases; glm4moe's sigmoid router);
        `experts` overrides where the layer's expert tensors are read from (e.g. a prefetch slot);
        with `staged`, the chosen experts are first copied into those slot tensors and read from
        there. The biases stay in VRAM, read by the experts' own ids."""
        cfg, w, p, s, T = self.cfg, self.w, f"blk.{il}.", g.s, g.T
        E, act = cfg.n_embd, cfg.spec.ffn.activation
        cur = g.residual_norm(w[p + cfg.spec.norms.ffn + ".weight"], cfg.norm_eps)
        router, ids, weights = s.cols("router", T), s.moe_ids.slice(1, 0, T), s.moe_w.slice(1, 0, T)
        g.matmul(w[p + "ffn_gate_inp.weight"], cur, router)
        if cfg.spec.moe.router_bias:
            g.call("router bias", lambda seq: add(seq, router, w[p + "ffn_gate_inp.bias"], router))
        g.add(Route(router, ids, weights, cfg.n_expert_used, cfg.expert_weights_norm,
                    chosen_softmax=cfg.spec.moe.router is Router.CHOSEN_SOFTMAX,
                    sigmoid_bias=w[p + "exp_probs_b.bias"] if cfg.spec.moe.router is Router.SIGMOID else None))
        if cfg.expert_weights_scale not in (0.0, 1.0):   # glm4moe's routed_scaling_factor
            g.call("routing scale", lambda seq: scale(seq, weights, cfg.expert_weights_scale, weights))
        stacks = [(t, ids) for t in (experts or tuple(w[p + n] for n in EXPERT_TENSORS))]
        if staged and staged.host is not None:
            self._host_plan(g, il, cur, ids, weights, stacks, staged)
        elif staged:
            self._stage(g, ids, stacks, staged)
        ge, ue, he, de = (getattr(s, n).slice(2, 0, T) for n in ("ge", "ue", "he", "de"))
        x3 = cur.view((E, 1, T))
        (gw, gi), (uw, ui), (dw, di) = stacks
        bg, bu, bd = (w[p + f"ffn_{n}_exps.bias"] if cfg.spec.moe.expert_bias else None for n in ("gate", "up", "down"))
        count = RouteCount()
        routes = staged.routes if staged is not None and staged.routes is not None else s.routes
        g.add(MulMatId(gw, x3, gi, ge, routes, count, ids, bg))
        g.add(MulMatId(uw, x3, ui, ue, routes, count, ids, bu))
        g.add(Glu(act, ge, ue, he))
        o, shared, gate_logit = s.cols("o", T), None, None
        if cfg.layers[il].ffn == MOE_SHARED:
            shared = o   # the shared expert's output
            self._gated_ffn(g, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"],
                            w[p + "ffn_down_shexp.weight"], cur, s.cols("sg", T), s.cols("su", T), s.cols("sh", T),
                            shared, "silu")
            if cfg.spec.moe.shared_gate:
                gate_logit = s.cols("sgate", T)
                inp = w[p + "ffn_gate_inp_shexp.weight"]
                g.matmul(inp.view((inp.ne[0], 1)), cur, gate_logit)
            o = cur   # the FFN input is no longer needed: the combined output goes there
        g.add(MulMatId(dw, he, di, de, routes, count, ids, bd))
        if shared is not None and gate_logit is None:   # added after the routed experts' sum
            g.add(MoeCombine(de, weights, o))
            g.call("shared expert", lambda seq: add(seq, o, shared, o))
        else:
            g.add(MoeCombine(de, weights, o, shared, gate_logit))
        if staged and staged.host is not None:
            cpu_sum = staged.host.cpu_sum.slice(1, 0, T)
            self._cut(f"moe {il} cpu experts", host=("cpu", il))
            g.call("cpu experts", lambda seq: add(seq, o, cpu_sum, o))
        self.block_output(g, o)

    def _host_plan(self, g: Graph, il: int, cur: Tensor, ids: Tensor, weights: Tensor, stacks: list,
                   staged: StagedExperts) -> None:
        """The routing goes to the host, which plans the step's copies and which experts the CPU
        computes; the GPU then copies the planned experts and reads every stack from its slots
        (the pairs the CPU computes read a zeroed slot with weight 0)."""
        s, T, h = g.s, g.T, staged.host
        remap, plan = s.moe_remap.slice(1, 0, T), s.moe_plan
        out = [(cur, h.x.slice(1, 0, T)), (ids, h.ids.slice(1, 0, T)), (weights, h.weights.slice(1, 0, T))]
        g.call("routing to host", lambda seq: [seq.copy(a.range(), b.range(), a.nbytes) for a, b in out])
        self._cut(f"moe {il} experts", host=("plan", il))
        back = [(h.remap.slice(1, 0, T), remap), (h.gpu_weights.slice(1, 0, T), weights), (h.plan, plan)]
        g.call("plan from host", lambda seq: [seq.copy(a.range(), b.range(), a.nbytes) for a, b in back])
        for r, slots in enumerate(staged.stacks):
            stack = stacks[r][0]
            g.call("stage copy", lambda seq, stack=stack, slots=slots: moe_stage_copy(
                seq, stack, slots, plan, staged.max_copies))
            stacks[r] = (slots, remap)

    def _stage(self, g: Graph, ids: Tensor, stacks: list, staged: StagedExperts) -> None:
        """Decode's copy of a host-resident layer's chosen experts into VRAM slots: the plan, then
        each staged stack's copy; those stacks are then read from their slots by remapped ids."""
        s, T = g.s, g.T
        remap, plan = s.moe_remap.slice(1, 0, T), s.moe_plan
        g.call("stage plan", lambda seq: moe_stage_plan(seq, ids, remap, plan, self.cfg.n_expert, state=staged.state,
                                                        cache_slots=staged.cache_slots,
                                                        stage_base=staged.stage_base))
        for r, slots in enumerate(staged.stacks):
            if slots is not None:
                stack = stacks[r][0]
                g.call("stage copy", lambda seq, stack=stack, slots=slots: moe_stage_copy(
                    seq, stack, slots, plan, staged.max_copies))
                stacks[r] = (slots, remap)
