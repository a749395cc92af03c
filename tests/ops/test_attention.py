"""Attention without flash (QK^T, masked softmax, PV) against the float64 reference and FlashAttn."""

from __future__ import annotations

import numpy as np
import pytest
from attn_reference import alibi_mask, attention_reference, causal_mask, make_qkv, nmse, random_mask

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.memory import F32, Tensor
from vkrt.ops.attention import Attention
from vkrt.ops.flash_attn import FlashAttn
from vkrt.ops.flash_work import FlashWork

TOL = 1e-11  # NMSE; fp32 arithmetic against float64
TOL_TANH = 1e-8


def scores_for(device, q, k) -> Tensor:
    """Attention's scores for numpy q (batch, n_head, n_q, hs) and k (batch, n_head_kv, n_kv, hs)."""
    return Tensor.empty(device, F32, (k.shape[2] * q.shape[0] * q.shape[1] * q.shape[2],))


def run(device, op, q, k, v, mask=None, *, scale=None, **kw):
    """Run Attention (over scores of its own) or FlashAttn (over a FlashWork of its own)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ts = [tensor_from_numpy(device, a) for a in (q, k, v)]
    tm = tensor_from_numpy(device, mask) if mask is not None else None
    out = Tensor.empty(device, F32, (v.shape[-1], q.shape[1], q.shape[2], q.shape[0]))
    memory = scores_for(device, q, k) if op is Attention else FlashWork(device)
    try:
        a = op(device, *ts, out, tm, scale=scale, **{"scores" if op is Attention else "work": memory}, **kw)
        with CommandSequence(device) as seq:
            with seq.record():
                a.record(seq)
            seq.run()
        return read_tensor(out)
    finally:
        for t in (*ts, tm, out, memory):
            if t is not None:
                t.close()


@pytest.mark.parametrize("hsk,hsv,gqa,kv", [(64, 64, 1, np.float16), (80, 80, 2, np.float32), (128, 128, 4, np.float16),
                                            (256, 256, 8, np.float16), (192, 128, 2, np.float32)])
def test_matches_reference_and_flash(device, hsk, hsv, gqa, kv):
    rng = np.random.default_rng(hsk + gqa)
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=8 // gqa, n_q=21, n_kv=75, hsk=hsk, hsv=hsv, kv_dtype=kv)
    mask = causal_mask(21, 75, pad_to=32)
    got = run(device, Attention, q, k, v, mask)
    ref = attention_reference(q, k, v, mask, scale=hsk ** -0.5)
    assert np.isfinite(got).all() and nmse(got, ref) < TOL
    flash = run(device, FlashAttn, q, k, v, mask)
    assert nmse(got, flash) < TOL


@pytest.mark.parametrize("n_q,hsv,gqa,kv,batch", [(1, 128, 4, np.float16, 1), (3, 80, 2, np.float32, 2),
                                                   (15, 64, 1, np.float16, 1), (1, 40, 2, np.float16, 1)])
def test_few_queries(device, n_q, hsv, gqa, kv, batch):
    """Fewer queries than a tile (decode and verify steps) take attn_qk_vec (8 lanes a key)
    and attn_pv_vec (a workgroup a query's 32 dims with its keys over 32 lanes; a head of 80 or 40
    leaves a part tile)."""
    rng = np.random.default_rng(n_q + hsv)
    q, k, v = make_qkv(rng, batch=batch, n_head=4, n_head_kv=4 // gqa, n_q=n_q, n_kv=203, hsk=hsv, hsv=hsv,
                       kv_dtype=kv)
    mask = random_mask(rng, n_q, 203)
    ts = [tensor_from_numpy(device, a) for a in (q, k, v, mask)]
    scores = scores_for(device, q, k)
    try:
        a = Attention(device, *ts[:3], Tensor.empty(device, F32, (hsv, 4, n_q, batch)), ts[3], scores=scores,
                      scale=hsv ** -0.5)
        assert a._vec
    finally:
        for t in (*ts, scores):
            t.close()
    got = run(device, Attention, q, k, v, mask)
    ref = attention_reference(q, k, v, mask, scale=hsv ** -0.5)
    assert np.isfinite(got).all() and nmse(got, ref) < TOL


@pytest.mark.parametrize("kind", ["none", "window", "dead_rows"])
def test_masks(device, kind):
    rng = np.random.default_rng(9)
    q, k, v = make_qkv(rng, n_q=18, n_kv=50)
    mask = {"none": None, "window": causal_mask(18, 50, window=10),
            "dead_rows": random_mask(rng, 18, 50, dead_rows=(1, 17))}[kind]
    got = run(device, Attention, q, k, v, mask)
    ref = attention_reference(q, k, v, mask, scale=0.125)
    assert np.isfinite(got).all() and nmse(got, ref) < TOL
    if kind == "dead_rows":
        assert (got[:, [1, 17]] == 0).all()


@pytest.mark.parametrize("softcap,max_bias", [(30.0, 0.0), (0.0, 8.0), (20.0, 2.0)])
def test_softcap_alibi(device, softcap, max_bias):
    rng = np.random.default_rng(int(softcap) + 1)
    q, k, v = make_qkv(rng, n_head=6, n_head_kv=2, n_q=9, n_kv=33)
    q *= 4
    mask = alibi_mask(9, 33)
    got = run(device, Attention, q, k, v, mask, scale=0.2, softcap=softcap, max_bias=max_bias)
    ref = attention_reference(q, k, v, mask, scale=0.2, softcap=softcap, max_bias=max_bias)
    assert nmse(got, ref) < (TOL_TANH if softcap else TOL)


def test_strided_q_and_kv_cache_views(device):
    rng = np.random.default_rng(12)
    n_q, n_kv, n_ctx, hs = 7, 30, 48, 40
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=n_q, n_kv=n_kv, hsk=hs, kv_dtype=np.float32)
    mask = causal_mask(n_q, n_kv)
    q_proj = tensor_from_numpy(device, np.ascontiguousarray(q[0].transpose(1, 0, 2)))  # (n_q, n_head, hs)
    caches = []
    for a in (k, v):
        cache = np.zeros((n_ctx, 2, hs), np.float32)
        cache[:n_kv] = a[0].transpose(1, 0, 2)
        caches.append(tensor_from_numpy(device, cache))
    tm = tensor_from_numpy(device, mask)
    out = Tensor.empty(device, F32, (hs, 4, n_q, 1))
    scores = scores_for(device, q, k)
    try:
        tk, tv = (c.permute(0, 2, 1, 3).slice(1, 0, n_kv) for c in caches)
        a = Attention(device, q_proj.permute(0, 2, 1, 3), tk, tv, out, tm, scale=0.15, scores=scores)
        with CommandSequence(device) as seq:
            with seq.record():
                a.record(seq)
            seq.run()
        assert nmse(read_tensor(out), attention_reference(q, k, v, mask, scale=0.15)) < TOL
    finally:
        for t in (q_proj, *caches, tm, out, scores):
            t.close()


def test_sinks_match_reference_and_flash(device):
    """Attention sinks (one value a query head) in the softmax: against the float64 reference and
    flash attention; a row that sees nothing stays 0."""
    rng = np.random.default_rng(21)
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=2, n_q=13, n_kv=40)
    mask = causal_mask(13, 40, pad_to=16)
    mask[0, 0, 5] = -np.inf
    sinks = rng.uniform(-4, 4, 8).astype(np.float32)
    sinks[3] = 30.0
    t = tensor_from_numpy(device, sinks)
    try:
        got = run(device, Attention, q, k, v, mask, sinks=t)
        flash = run(device, FlashAttn, q, k, v, mask, sinks=t)
    finally:
        t.close()
    ref = attention_reference(q, k, v, mask, scale=64 ** -0.5, sinks=sinks)
    assert np.isfinite(got).all() and nmse(got, ref) < TOL and nmse(got, flash) < TOL
    assert (got[:, 5] == 0).all()
    assert nmse(ref, attention_reference(q, k, v, mask, scale=64 ** -0.5)) > 1e-3
