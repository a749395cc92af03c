"""A Gated DeltaNet (linear attention) block of qwen35 / qwen35moe / qwen3next; its state lives in
the recurrent-state cache (one slot per sequence), not in the KV cache.

    qkv, z = attn_qkv·cur, attn_gate·cur
    alpha, beta = ssm_alpha·cur, ssm_beta·cur
    qkv = silu(conv1d(qkv))            causal, over the last ssm.conv_kernel positions (state: conv)
    o = delta_rule(q, k, v, alpha, beta)      L2-normed q and k; decay exp(softplus(alpha + ssm_dt)
                                              * ssm_a), write strength sigmoid(beta) (state: S)
    o = rms_norm(o) * ssm_norm * silu(z)       per value head
    out = ssm_out·o

qwen3next's value heads reach the kernels in tiled order (delta_net_layout.py); the gated norm
reads them through a view that writes each head back to the file's place, where z and ssm_out
have it.
"""

from __future__ import annotations

from ..ops.delta_net import delta_net
from ..ops.norm import rms_norm
from ..ops.ssm_conv import ssm_conv
from .tensors import grouped_delta_net


def record_delta_net(tf, g, state, il: int, n_seqs: int) -> None:
    """Emit layer il's DeltaNet block into the Graph g for T tokens of n_seqs sequences (T / n_seqs each)."""
    cfg, w, p, s, T = tf.cfg, tf.w, f"blk.{il}.", g.s, g.T
    D, Hk, Hv = cfg.ssm_head_dim, cfg.ssm_k_heads, cfg.ssm_v_heads
    cur = g.residual_norm(w[p + "attn_norm.weight"], cfg.norm_eps)
    # a short step's conv input and output, alpha and beta where the state keeps them (a
    # speculative step taken back part way runs the delta rule again over them: catch_up); the
    # outputs of projections read together (the stacked fusion) lie back to back either way
    kept = state.kept_views(il, T)
    if kept is None:
        qkvz, ab, C = s.cols("qkvz", T), s.cols("ab", T), cfg.ssm_conv_dim
        kept = (qkvz.slice(0, 0, C), qkvz.slice(0, C, qkvz.ne[0]), s.cols("conv", T), ab.slice(0, 0, Hv),
                ab.slice(0, Hv, 2 * Hv))
    qkv, z, conv, alpha, beta = kept
    for name, out in (("attn_qkv", qkv), ("attn_gate", z), ("ssm_alpha", alpha), ("ssm_beta", beta)):
        g.matmul(w[p + name + ".weight"], cur, out)
    slots = s.slots.slice(0, 0, n_seqs)
    g.call("ssm_conv", lambda seq: ssm_conv(seq, qkv, w[p + "ssm_conv1d.weight"], state.conv[il], slots, conv,
                                            n_seqs=n_seqs))
    out = s.attn.view((Hv * D, T))
    g.call("delta_net", lambda seq: record_rule(tf, seq, il, conv, alpha, beta, state.ssm[il], slots, out,
                                                n_seqs=n_seqs, workspace=s.dn_work))
    normed = s.cols("dn_norm", T)
    if grouped_delta_net(cfg):   # kernel head r * Hk + g is the file's head g * rep + r
        rep = Hv // Hk
        x4 = out.view((D, Hk, rep, T))
        z4, n4 = (t.view((D, Hk, rep, T), nb=(4, 4 * rep * D, 4 * D, t.nb[1])) for t in (z, normed))
        g.call("gated norm", lambda seq: rms_norm(seq, x4, n4, cfg.norm_eps, w[p + "ssm_norm.weight"], gate=z4))
    else:
        g.call("gated norm", lambda seq: rms_norm(seq, out.view((D, Hv, T)), normed.view((D, Hv, T)), cfg.norm_eps,
                                                  w[p + "ssm_norm.weight"], gate=z.view((D, Hv, T), nb=(4, 4 * D, z.nb[1]))))
    o = s.cols("o", T)
    g.matmul(w[p + "ssm_out.weight"], normed, o)
    tf.block_output(g, o)


def record_rule(tf, seq, il: int, conv, alpha, beta, ssm, slots, out, *, n_seqs: int = 1, workspace=None,
                span: bool = False, state_in=None) -> None:
    """Record layer il's delta rule over `conv` (silu(conv1d(qkv)) of its tokens), alpha and beta,
    advancing the state `ssm` of `slots` (n_seqs sequences), into `out`: the block's step, and a
    speculative step's catch-up over the kept columns (RecurrentState.catch_up; no workspace:
    the recurrent form, as a step of that many tokens takes; `span`: over the columns slots[1:3]
    say, from `state_in` where given, ops.delta_net)."""
    cfg, w, p = tf.cfg, tf.w, f"blk.{il}."
    delta_net(seq, conv, alpha, beta, w[p + "ssm_dt.bias"], w[p + "ssm_a"], ssm, slots, out,
              n_k_heads=cfg.ssm_k_heads, n_v_heads=cfg.ssm_v_heads, head_dim=cfg.ssm_head_dim, n_seqs=n_seqs,
              eps=cfg.norm_eps, workspace=workspace, span=span, state_in=state_in)
