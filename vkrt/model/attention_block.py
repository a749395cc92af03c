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

from ..ops.attention import Attention
from ..ops.elementwise import add, gate_mul
from ..ops.fa_norm_rope import fa_norm_rope
from ..ops.flash_attn import FlashAttn
from ..ops.head_epilogue import head_epilogue
from ..ops.matmul import head_epilogue_fits, matmul
from ..ops.norm_rope import can_store_v, norm_rope
from ..ops.rope import rope
from ..ops.set_rows import set_rows
from .arch import Bias, QKNorm, RopeKind
from .fusions import project


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


def head_epilogues(tf, seq, s, cache, il, T, q_temp, norms, pos, cells, args) -> list | None:
    """The HeadEpilogues of layer il's q, k and v projections (VKRT_FUSE_QKV_ROPE: each head's
    norm, RoPE and cache store in its projection's last workgroup, norm_rope's bits, no norm_rope
    dispatch); None where a step of T tokens cannot take them: fusions off, the q/k/v mat-vec
    fused (VKRT_FUSE_QKV), biases, norms over whole rows, an attention temperature, more tokens
    than one mat-vec run, or a projection whose workgroups do not fit its heads. norms, pos,
    cells, args: the q/k norm weights, positions, cache cells and RoPE arguments norm_rope gets."""
    cfg, w, p, f = tf.cfg, tf.w, f"blk.{il}.", tf.fusions
    if (not (f.qkv_rope and f.norm_rope) or f.qkv or cfg.spec.attn.qkv_bias is not Bias.NONE
            or cfg.spec.attn.qk_norm is QKNorm.WHOLE_ROW or q_temp):
        return None
    D, Dv, H, KV = cfg.head_dim_k, cfg.head_dim_v, cfg.n_head, cfg.n_head_kv
    q_block = 2 * D if cfg.spec.attn.gate else D
    weights = [w[p + n + ".weight"] for n in ("attn_q", "attn_k", "attn_v")]
    if not all(head_epilogue_fits(seq.device, wt, T, b) for wt, b in zip(weights, (q_block, D, Dv))):
        return None
    count = s.head_counters(H, KV, KV)
    epis = [head_epilogue(seq, s.cols("q", T), D, count[0], s.cols("qr", T).view((D, H, T)),
                          block=q_block, weight=norms["q"], eps=cfg.norm_eps, positions=pos, rope_args=args),
            head_epilogue(seq, s.cols("k", T), D, count[1], cache.k[il], weight=norms["k"],
                          eps=cfg.norm_eps, positions=pos, rows=cells, rope_args=args),
            head_epilogue(seq, s.cols("v", T), Dv, count[2], cache.v[il], rows=cells)]
    return epis if all(e is not None for e in epis) else None


def record_norm_rope(tf, seq, cache, il, q3, k3, v3, qr, kr, q_temp, norms, pos, cells, args) -> None:
    """Record layer il's q/k norm, RoPE and the K/V stores into the cache as their own dispatches:
    norm_rope (VKRT_FUSE_NORM_ROPE; q riding in K's dispatch with QK_ROPE, V's store with
    KV_STORE), else rms_norm, rope and set_rows apart. The rotated queries go to qr."""
    cfg, p = tf.cfg, f"blk.{il}."
    if tf.fusions.norm_rope:   # q/k norm, RoPE and K's store into the cache: two kernels
        with_q = (q3, qr, norms["q"]) if tf.fusions.qk_rope and not q_temp else None   # q rides in K's dispatch
        if with_q is None:
            norm_rope(seq, q3, pos, qr, weight=norms["q"], eps=cfg.norm_eps, **args, **q_temp)
        store_v = (v3, cache.v[il]) if tf.fusions.kv_store and can_store_v(k3, cache.k[il], v3, cache.v[il]) else None
        norm_rope(seq, k3, pos, cache.k[il], weight=norms["k"], eps=cfg.norm_eps, rows=cells, store_v=store_v,
                  with_q=with_q, **args)
        if store_v is None:
            set_rows(seq, v3, cells, cache.v[il])
        return
    if cfg.spec.attn.qk_norm is QKNorm.PER_HEAD:
        tf.norm(seq, q3, qr, p + "attn_q_norm.weight")
        tf.norm(seq, k3, k3, p + "attn_k_norm.weight")
        q3 = qr
    rope(seq, q3, pos, qr, **args, **q_temp)
    rope(seq, k3, pos, kr, **args)
    set_rows(seq, kr, cells, cache.k[il])
    set_rows(seq, v3, cells, cache.v[il])


def record_attention(tf, seq, s, cache, il, T, n_kv, mask, flash, split_as=None):
    """Record layer il's attention block (flash attention's work buffers are the Scratch's).
    split_as = (tokens, their mask): flash attention splits the KV cells as a step of that many
    tokens would (a row's sums depend on the splits only, not on how many rows run)."""
    cfg, w, p = tf.cfg, tf.w, f"blk.{il}."
    D, Dv, H, KV = cfg.head_dim_k, cfg.head_dim_v, cfg.n_head, cfg.n_head_kv
    cur = s.cols("cur", T)
    tf.add_norm(seq, s, T, p + "attn_norm.weight")
    q, k, v = s.cols("q", T), s.cols("k", T), s.cols("v", T)
    projections = ((q, "attn_q"), (k, "attn_k"), (v, "attn_v"))
    q_temp = {"attn_temp": (cfg.attn_temp_scale, cfg.attn_temp_floor)} if cfg.attn_temp_scale else {}
    norms = {n: w[p + f"attn_{n}_norm.weight"] if cfg.spec.attn.qk_norm is QKNorm.PER_HEAD else None for n in "qk"}
    pos, cells, args = positions(cfg, s, T), s.cells.slice(0, 0, T), rope_args(cfg, tf.rope_factors, il)
    epis = head_epilogues(tf, seq, s, cache, il, T, q_temp, norms, pos, cells, args)
    if epis is not None:   # each head normed, rotated and stored by its projection's last workgroup
        for (t, name), epi in zip(projections, epis):
            matmul(seq, w[p + name + ".weight"], cur, t, head_epi=epi)
    else:
        project(seq, [(w[p + name + ".weight"], t) for t, name in projections], cur, tf.fusions.qkv)
    for t, name in projections:
        if cfg.spec.attn.qkv_bias is not Bias.NONE and p + name + ".bias" in w:
            add(seq, t, w[p + name + ".bias"], t)
    if cfg.spec.attn.qk_norm is QKNorm.WHOLE_ROW:
        tf.norm(seq, q, q, p + "attn_q_norm.weight")
        tf.norm(seq, k, k, p + "attn_k_norm.weight")
    if cfg.spec.attn.gate:   # per head: D query values, then D gate values
        q3 = q.view((D, H, T), nb=(4, 8 * D, 8 * D * H))
        gate = q.view((D, H, T), nb=(4, 8 * D, 8 * D * H), offset=4 * D)
    else:
        q3, gate = q.view((D, H, T)), None
    k3 = k.view((D, KV, T))
    qr, kr = s.cols("qr", T).view((D, H, T)), s.cols("kr", T).view((D, KV, T))
    v3 = v.view((Dv, KV, T))
    out = s.attn.view((Dv, H, T))
    attn_args = (seq.device, qr.permute(0, 2, 1, 3), cache.k[il].slice(1, 0, n_kv), cache.v[il].slice(1, 0, n_kv),
                 out, mask)
    sinks = w[p + "attn_sinks.weight"] if cfg.spec.attn.sinks else None
    op = None
    if flash:  # layers attending through the same mask share one mask_opt pre-pass
        split_k = None
        if split_as is not None:   # the split a step of split_as[0] tokens takes (decided, not recorded)
            P = split_as[0]
            split_k = FlashAttn(seq.device, s.cols("qr", P).view((D, H, P)).permute(0, 2, 1, 3), attn_args[2],
                                attn_args[3], s.attn.view((Dv, H, P)), split_as[1], scale=cfg.attn_scale, sinks=sinks,
                                kv_used=s.kv_used, mask_opt=False, label=f"flash attention {il} (split plan)").n_split
        # one token: the attention's prologue may do norm_rope's work (VKRT_FUSE_FA_ROPE)
        prologue = (fa_norm_rope(seq.device, q3, k3, v3, pos, cells, cache.k[il], cache.v[il], q_weight=norms["q"],
                                 k_weight=norms["k"], eps=cfg.norm_eps, rope_args=args)
                    if epis is None and T == 1 and tf.fusions.norm_rope and tf.fusions.fa_rope and not q_temp else None)
        op = FlashAttn(*attn_args, scale=cfg.attn_scale, label=f"flash attention {il}", kv_used=s.kv_used,
                       share_mask_opt=s.mask_opt_owner.get(id(mask)), sinks=sinks, mask_opt=tf.fa_mask_opt,
                       split_k=split_k, work=s.flash_work, prologue=prologue)
        s.mask_opt_owner.setdefault(id(mask), op)
    # (with epis the projections' epilogues normed, rotated and stored every head, with the
    # attention's prologue the attention does)
    if (op is None or op.prologue is None) and epis is None:
        record_norm_rope(tf, seq, cache, il, q3, k3, v3, qr, kr, q_temp, norms, pos, cells, args)
    if op is None:
        op = Attention(*attn_args, scale=cfg.attn_scale, scores=s.scores, sinks=sinks, label=f"attention {il}")
    op.record(seq)
    if gate is not None:
        gate_mul(seq, out, gate, out, act="sigmoid")
    o = s.cols("o", T)
    matmul(seq, w[p + "attn_output.weight"], s.attn.view((Dv * H, T)), o)
    if cfg.spec.attn.out_bias is not Bias.NONE and p + "attn_output.bias" in w:
        add(seq, o, w[p + "attn_output.bias"], o)
    if cfg.spec.norms.post:
        tf.norm(seq, o, o, p + "post_attention_norm.weight")
    tf.block_output(seq, s, o)
