"""Softmax attention over the KV cache (full or sliding window), with qwen35's per-head output
gate and gpt-oss's attention sinks where the architecture has them.

    q (| gate), k, v = attn_q·cur (+ bias), attn_k·cur (+ bias), attn_v·cur (+ bias)
    q, k = rms_norm per head * attn_{q,k}_norm        (qwen3, gemma3, qwen35; olmoe: over each
                                                       token's whole q and k)
    q, k = rope(q), rope(k)                           (qwen35: multi-section, a quarter of the head;
                                                       gpt-oss: YaRN)
    cache_k[cells], cache_v[cells] = k, v
    a = attention(q, cache_k[:n_kv], cache_v[:n_kv], mask)   (* sigmoid(gate) for qwen35; gpt-oss:
                                                       attn_sinks in each head's softmax; granite:
                                                       attention.scale for 1/sqrt(d))
    o = attn_output·a (+ attn_output.bias)            (post_attention_norm for gemma3; granite:
                                                       times residual_scale)
"""

from __future__ import annotations

from ..ops.elementwise import add, gate_mul
from .arch import Bias, QKNorm, RopeKind
from .nodes import Attend, QKRope


def rope_args(cfg, freq_factors, il: int) -> dict:
    """The RoPE arguments of layer il (shared by rope and norm_rope); `freq_factors` the
    transformer's (rope_freqs, or LongRoPE's for its context; None: none)."""
    args = dict(n_dims=cfg.rope_dims, freq_base=cfg.layer_rope_base(il), freq_scale=cfg.layer_rope_scale(il),
                neox=cfg.spec.rope.kind is not RopeKind.NORMAL, freq_factors=freq_factors,
                attn_factor=cfg.rope_attn_factor)
    if cfg.rope_ext_factor:   # YaRN
        args.update(ext_factor=cfg.rope_ext_factor, n_ctx_orig=cfg.n_ctx_orig_yarn, beta_fast=cfg.yarn_beta_fast,
                    beta_slow=cfg.yarn_beta_slow)
    if cfg.spec.rope.kind is RopeKind.IMROPE:
        args.update(sections=cfg.rope_sections, interleaved=True)
    return args


def positions(cfg, s, T):
    """The positions tensor a T-token step reads: 4 streams of T with sectioned RoPE."""
    return s.pos.slice(0, 0, cfg.pos_streams * T)


def record_attention(tf, g, cache, il: int, n_kv: int, mask, mask_zero, flash: bool, split_as=None) -> None:
    """Emit layer il's attention block into the Graph g (flash attention's work buffers are the
    Scratch's; `mask_zero` the step input flagging `mask` all zero on its live cells, or None).
    split_as = (tokens, their mask): flash attention splits the KV cells as a step of that many
    tokens would (a row's sums depend on the splits only, not on how many rows run)."""
    cfg, w, p, s, T = tf.cfg, tf.w, f"blk.{il}.", g.s, g.T
    D, Dv, H, KV, eps = cfg.head_dim_k, cfg.head_dim_v, cfg.n_head, cfg.n_head_kv, cfg.norm_eps
    cur = g.residual_norm(w[p + "attn_norm.weight"], eps)
    # q, k and v each contiguous, one after another: one token's lie back to back (the stacked
    # fusion reads decode's three projections as one mat-vec)
    rows = (H * D * (2 if cfg.spec.attn.gate else 1), KV * D, KV * Dv)
    q, k, v = (s.qkv.view((r, T), offset=4 * T * sum(rows[:j])) for j, r in enumerate(rows))
    projections = ((q, "attn_q"), (k, "attn_k"), (v, "attn_v"))
    for t, name in projections:
        g.matmul(w[p + name + ".weight"], cur, t)
    for t, name in projections:
        if cfg.spec.attn.qkv_bias is not Bias.NONE and p + name + ".bias" in w:
            g.call("bias", lambda seq, t=t, b=w[p + name + ".bias"]: add(seq, t, b, t))
    if cfg.spec.attn.qk_norm is QKNorm.WHOLE_ROW:
        g.norm(q, q, w[p + "attn_q_norm.weight"], eps)
        g.norm(k, k, w[p + "attn_k_norm.weight"], eps)
    if cfg.spec.attn.gate:   # per head: D query values, then D gate values
        q3 = q.view((D, H, T), nb=(4, 8 * D, 8 * D * H))
        gate = q.view((D, H, T), nb=(4, 8 * D, 8 * D * H), offset=4 * D)
    else:
        q3, gate = q.view((D, H, T)), None
    qr = s.cols("qr", T).view((D, H, T))
    per_head = cfg.spec.attn.qk_norm is QKNorm.PER_HEAD
    norms = {n: w[p + f"attn_{n}_norm.weight"] if per_head else None for n in "qk"}
    q_temp = {"attn_temp": (cfg.attn_temp_scale, cfg.attn_temp_floor)} if cfg.attn_temp_scale else {}
    g.add(QKRope(q3, k.view((D, KV, T)), v.view((Dv, KV, T)), qr, s.cols("kr", T).view((D, KV, T)), cache.k[il],
                 cache.v[il], s.cells.slice(0, 0, T), positions(cfg, s, T), norms["q"], norms["k"], eps,
                 rope_args(cfg, tf.rope_factors, il), q_temp, cache.k_rot, cache.v_rot))
    out = s.attn.view((Dv, H, T))
    plan = None
    if split_as is not None:   # the queries, output and mask of a step of split_as[0] tokens
        P = split_as[0]
        plan = (s.cols("qr", P).view((D, H, P)).permute(0, 2, 1, 3), s.attn.view((Dv, H, P)), split_as[1])
    g.add(Attend(qr.permute(0, 2, 1, 3), cache.k[il].slice(1, 0, n_kv), cache.v[il].slice(1, 0, n_kv), out, mask,
                 cfg.attn_scale, w[p + "attn_sinks.weight"] if cfg.spec.attn.sinks else None, flash, s,
                 f"flash attention {il}" if flash else f"attention {il}", tf.fa_mask_opt, plan, cache.v_rot,
                 mask_zero))
    if gate is not None:
        g.call("gate", lambda seq: gate_mul(seq, out, gate, out, act="sigmoid"))
    o = s.cols("o", T)
    g.matmul(w[p + "attn_output.weight"], s.attn.view((Dv * H, T)), o)
    if cfg.spec.attn.out_bias is not Bias.NONE and p + "attn_output.bias" in w:
        g.call("bias", lambda seq: add(seq, o, w[p + "attn_output.bias"], o))
    if cfg.spec.norms.post:
        g.norm(o, o, w[p + "post_attention_norm.weight"], eps)
    tf.block_output(g, o)
