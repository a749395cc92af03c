"""norm_rope: q/k RMS norm + RoPE (+ the K store into the cache) in one kernel, bit for bit against
rms_norm, rope and set_rows apart, which have their own numpy tests."""

import numpy as np
import pytest

from test_rope import rope_multi_ref
from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.errors import OutOfRange
from vkrt.memory import Tensor
from vkrt.ops.hadamard import hadamard
from vkrt.ops.norm import rms_norm
from vkrt.ops.norm_rope import norm_rope
from vkrt.ops.rope import rope
from vkrt.ops.set_rows import set_rows

N_TOK, N_HEAD, N_CELLS = 5, 3, 11


def case(device, head_dim, n_dims, neox, norm, cache, ff, sections=None, interleaved=False, yarn=False, temp=False):
    rng = np.random.default_rng(head_dim + n_dims + 2 * neox + 4 * norm)
    x = (rng.standard_normal((N_TOK, N_HEAD, head_dim)) * 3).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    if sections is not None:   # streams t, h, w, e
        pos = np.concatenate([pos, rng.integers(0, 3000, 2 * N_TOK), [0, 0, 0, 0, 1234]]).astype(np.int32)
    rows = np.array([3, 0, 10, 4, 7], np.int32)
    own = [tensor_from_numpy(device, a) for a in (x, pos, rows,
                                                  rng.uniform(0.5, 1.5, head_dim).astype(np.float32),
                                                  rng.uniform(1.0, 4.0, n_dims // 2).astype(np.float32))]
    tx, tp, trows, tw, tff = own
    args = dict(n_dims=n_dims, freq_base=10000.0, neox=neox, freq_factors=tff if ff else None)
    if sections is not None:
        args.update(sections=sections, interleaved=interleaved)
    if yarn:   # gpt-oss's YaRN
        args.update(freq_scale=1 / 32, ext_factor=1.0, n_ctx_orig=4096, attn_factor=1.0)
    if temp:   # mistral3's attention temperature, past its floor at position 100 and 4095
        args.update(attn_temp=(0.1, 8))
    shape = (head_dim, N_CELLS, N_HEAD) if cache else x.shape[::-1]
    outs = [Tensor.empty(device, cache or "F32", shape) for _ in range(2)]
    tmp = [Tensor.empty(device, "F32", x.shape[::-1]) for _ in range(2)]
    own += outs + tmp
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                for o in outs:   # cells no token writes must match too
                    seq.fill(o.range(), 0)
                src = tx
                if norm:
                    rms_norm(seq, tx, tmp[0], 1e-6, tw)
                    src = tmp[0]
                rope(seq, src, tp, tmp[1] if cache else outs[0], **args)
                if cache:
                    set_rows(seq, tmp[1], trows, outs[0])
                norm_rope(seq, tx, tp, outs[1], weight=tw if norm else None, eps=1e-6,
                          rows=trows if cache else None, **args)
            seq.run()
        return [read_tensor(o) for o in outs]
    finally:
        for t in own:
            t.close()


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("head_dim,n_dims", [(128, 128), (64, 32)])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("cache", [None, "F16", "F32"])
def test_same_bits_as_the_separate_kernels(device, neox, head_dim, n_dims, norm, cache):
    apart, fused = case(device, head_dim, n_dims, neox, norm, cache, ff=False)
    assert np.abs(apart).max() > 0
    bits = np.uint16 if cache == "F16" else np.uint32
    np.testing.assert_array_equal(apart.view(bits), fused.view(bits))


@pytest.mark.parametrize("cache", [None, "F16"])
def test_yarn_same_bits_as_the_separate_kernels(device, cache):
    apart, fused = case(device, 64, 64, True, False, cache, ff=False, yarn=True)
    bits = np.uint16 if cache == "F16" else np.uint32
    np.testing.assert_array_equal(apart.view(bits), fused.view(bits))


@pytest.mark.parametrize("norm", [False, True])
def test_attention_temperature_same_bits_as_the_separate_kernels(device, norm):
    apart, fused = case(device, 64, 64, False, norm, None, ff=False, temp=True)
    plain, _ = case(device, 64, 64, False, norm, None, ff=False)
    assert not np.array_equal(apart, plain)
    np.testing.assert_array_equal(apart.view(np.uint32), fused.view(np.uint32))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("head_dim,n_dims,sections", [(64, 16, (3, 3, 2, 0)), (256, 64, (11, 11, 10, 0))])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("cache", [None, "F16", "F32"])
def test_sectioned_same_bits_as_the_separate_kernels(device, interleaved, head_dim, n_dims, sections, norm, cache):
    apart, fused = case(device, head_dim, n_dims, True, norm, cache, ff=False, sections=sections,
                        interleaved=interleaved)
    assert np.abs(apart).max() > 0
    bits = np.uint16 if cache == "F16" else np.uint32
    np.testing.assert_array_equal(apart.view(bits), fused.view(bits))


def test_query_view_of_the_gated_projection(device):
    """qwen35's query projection holds [query D, gate D] per head: q is the view ne (D, H, T),
    nb (4, 8D, 8DH). norm + IMROPE of that view reads no gate value (they are NaN here) and, written
    into the same layout, leaves the gate half of the output alone."""
    d, n_head, n_tok, n_dims, sections = 256, 2, 3, 64, (11, 11, 10, 0)
    rng = np.random.default_rng(5)
    qg = np.full((n_tok, n_head, 2 * d), np.nan, np.float32)
    qg[..., :d] = rng.standard_normal((n_tok, n_head, d)) * 3
    w = rng.uniform(0.5, 1.5, d).astype(np.float32)
    pos = np.concatenate([[5, 900, 4000], rng.integers(0, 3000, 2 * n_tok), np.zeros(n_tok)]).astype(np.int32)
    gate_out = np.full_like(qg, 7.0)
    own = [tensor_from_numpy(device, a) for a in (qg, w, pos, gate_out)]
    tqg, tw, tp, tout = own
    view = dict(ne=(d, n_head, n_tok), nb=(4, 8 * d, 8 * d * n_head))
    q, fused = tqg.view(**view), tout.view(**view)
    tmp, apart = Tensor.empty(device, "F32", (d, n_head, n_tok)), Tensor.empty(device, "F32", (d, n_head, n_tok))
    own += [tmp, apart]
    args = dict(n_dims=n_dims, freq_base=1e7, sections=sections, interleaved=True)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                norm_rope(seq, q, tp, fused, weight=tw, eps=1e-6, **args)
                rms_norm(seq, q, tmp, 1e-6, tw)
                rope(seq, tmp, tp, apart, **args)
            seq.run()
        got, want_bits = read_tensor(tout), read_tensor(apart)
    finally:
        for t in own:
            t.close()
    np.testing.assert_array_equal(got[..., d:], gate_out[..., d:])
    np.testing.assert_array_equal(got[..., :d].view(np.uint32), want_bits.view(np.uint32))
    x = qg[..., :d].astype(np.float64)
    normed = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(got[..., :d], rope_multi_ref(normed, pos, n_dims, 1e7, sections, True),
                               atol=2.5e-3)  # as test_rope: fp32 theta near 4096 rad, a few ulps (4.9e-4 each)


def test_frequency_factors(device):
    apart, fused = case(device, 128, 128, True, True, "F16", ff=True)
    np.testing.assert_array_equal(apart.view(np.uint16), fused.view(np.uint16))


@pytest.mark.parametrize("cache_type,cache_shape,kw,says", [
    ("F16", (64, 8, 3), {}, "does not fit the cache"),
    ("Q8_0", (64, 8, 4), {"v_rot": 64}, "rides with its store"),   # V's rotation without V's store
])
def test_refused(device, cache_type, cache_shape, kw, says):
    x = tensor_from_numpy(device, np.zeros((2, 4, 64), np.float32))
    pos = tensor_from_numpy(device, np.zeros(2, np.int32))
    cache = Tensor.empty(device, cache_type, cache_shape)
    try:
        with CommandSequence(device) as seq, seq.record():
            with pytest.raises(OutOfRange, match=says):
                norm_rope(seq, x, pos, cache, rows=pos, n_dims=64, freq_base=1e4, **kw)
    finally:
        for t in (x, pos, cache):
            t.close()


@pytest.mark.parametrize("cache", ["F16", "F32"])
def test_v_store_rides_in_the_k_dispatch(device, cache):
    """store_v: V's rows land in their cache cells with set_rows' bits, K's as without it, and
    cells no token names keep what they held."""
    rng = np.random.default_rng(11)
    head_dim = 64
    k, v = ((rng.standard_normal((N_TOK, N_HEAD, head_dim)) * 3).astype(np.float32) for _ in range(2))
    rows = np.array([3, 0, 10, 4, 7], np.int32)
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    own = [tensor_from_numpy(device, a) for a in (k, v, rows, pos)]
    tk, tv, trows, tp = own
    caches = [Tensor.empty(device, cache, (head_dim, N_CELLS, N_HEAD)) for _ in range(4)]   # K, V apart; K, V fused
    own += caches
    args = dict(n_dims=head_dim, freq_base=1e4, neox=True)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                for c in caches:
                    seq.fill(c.range(), 0x3C003C00)   # 1.0 in f16 pairs (a 1.875 f32): untouched cells show it
                norm_rope(seq, tk, tp, caches[0], rows=trows, **args)
                set_rows(seq, tv, trows, caches[1])
                norm_rope(seq, tk, tp, caches[2], rows=trows, store_v=(tv, caches[3]), **args)
            seq.run()
        k_apart, v_apart, k_fused, v_fused = (read_tensor(c) for c in caches)
    finally:
        for t in own:
            t.close()
    bits = np.uint16 if cache == "F16" else np.uint32
    np.testing.assert_array_equal(k_apart.view(bits), k_fused.view(bits))
    np.testing.assert_array_equal(v_apart.view(bits), v_fused.view(bits))
    np.testing.assert_allclose(v_fused[:, rows, :], v.transpose(1, 0, 2), rtol=1e-3)   # [head, cell, dim]
    assert not np.isin(np.arange(N_CELLS), rows).all()
    untouched = np.setdiff1d(np.arange(N_CELLS), rows)
    np.testing.assert_array_equal(v_fused[:, untouched, :].view(bits), v_apart[:, untouched, :].view(bits))


def test_v_store_needs_matching_layouts(device):
    x = tensor_from_numpy(device, np.zeros((2, 4, 64), np.float32))
    v = tensor_from_numpy(device, np.zeros((2, 4, 32), np.float32))
    pos = tensor_from_numpy(device, np.zeros(2, np.int32))
    kc, vc = Tensor.empty(device, "F16", (64, 8, 4)), Tensor.empty(device, "F16", (32, 8, 4))
    try:
        with CommandSequence(device) as seq, seq.record():
            with pytest.raises(OutOfRange, match="not laid out"):
                norm_rope(seq, x, pos, kc, rows=pos, store_v=(v, vc), n_dims=64, freq_base=1e4)
            with pytest.raises(OutOfRange, match="needs rows"):
                norm_rope(seq, x, pos, x, store_v=(x, kc), n_dims=64, freq_base=1e4)
    finally:
        for t in (x, v, pos, kc, vc):
            t.close()


@pytest.mark.parametrize("cache", ["F16", "F32"])
@pytest.mark.parametrize("norm, sections, ff, store_v", [(True, None, False, True), (False, None, True, False),
                                                         (True, (11, 11, 10, 0), False, True),
                                                         (False, (11, 11, 10, 0), False, False)])
def test_q_rides_in_the_k_dispatch(device, cache, norm, sections, ff, store_v):
    """with_q: the queries (more heads than K, GQA) normed and rotated in K's dispatch land with the
    bits of their own norm_rope, K's and V's cache rows with the bits of theirs; with and without
    the norm, V's store and frequency factors, and with IMROPE sections (the flags then defines)."""
    rng = np.random.default_rng(5 + norm + 2 * ff)
    head_dim, n_q = 64, 2 * N_HEAD
    q = (rng.standard_normal((N_TOK, n_q, head_dim)) * 3).astype(np.float32)
    k, v = ((rng.standard_normal((N_TOK, N_HEAD, head_dim)) * 3).astype(np.float32) for _ in range(2))
    rows = np.array([3, 0, 10, 4, 7], np.int32)
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    if sections is not None:
        pos = np.concatenate([pos, rng.integers(0, 3000, 2 * N_TOK), [0, 0, 0, 0, 1234]]).astype(np.int32)
    scales = [rng.uniform(lo, hi, n).astype(np.float32) for lo, hi, n in ((0.5, 1.5, head_dim), (0.5, 1.5, head_dim),
                                                                           (1.0, 4.0, head_dim // 2))]
    own = [tensor_from_numpy(device, a) for a in (q, k, v, rows, pos, *scales)]
    tq, tk, tv, trows, tp, twq, twk, tff = own
    caches = [Tensor.empty(device, cache, (head_dim, N_CELLS, N_HEAD)) for _ in range(4)]   # K, V apart; fused
    qouts = [Tensor.empty(device, "F32", q.shape[::-1]) for _ in range(2)]
    own += caches + qouts
    args = dict(n_dims=head_dim, freq_base=1e4, neox=True, freq_factors=tff if ff else None)
    if sections is not None:
        args.update(sections=sections, interleaved=True)
    wq, wk = (twq, twk) if norm else (None, None)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                for c in caches:
                    seq.fill(c.range(), 0)
                norm_rope(seq, tq, tp, qouts[0], weight=wq, eps=1e-6, **args)
                norm_rope(seq, tk, tp, caches[0], weight=wk, eps=1e-6, rows=trows, **args)
                set_rows(seq, tv, trows, caches[1])
                norm_rope(seq, tk, tp, caches[2], weight=wk, eps=1e-6, rows=trows, with_q=(tq, qouts[1], wq),
                          store_v=(tv, caches[3]) if store_v else None, **args)
                if not store_v:
                    set_rows(seq, tv, trows, caches[3])
            seq.run()
        got = [read_tensor(t) for t in caches + qouts]
    finally:
        for t in own:
            t.close()
    bits = np.uint16 if cache == "F16" else np.uint32
    for a, b in ((got[0], got[2]), (got[1], got[3])):
        np.testing.assert_array_equal(a.view(bits), b.view(bits))
    np.testing.assert_array_equal(got[4].view(np.uint32), got[5].view(np.uint32))
    assert np.abs(got[5]).max() > 0


def test_q_riding_refuses_what_it_cannot_carry(device):
    """The queries keep their own dispatch where they would need the temperature, another head
    size, or K's dispatch does not store into a cache."""
    q = tensor_from_numpy(device, np.ones((2, 8, 64), np.float32))
    q32 = tensor_from_numpy(device, np.ones((2, 8, 32), np.float32))
    k = tensor_from_numpy(device, np.ones((2, 4, 64), np.float32))
    pos = tensor_from_numpy(device, np.zeros(2, np.int32))
    kc, qo, qo32, plain = (Tensor.empty(device, t, shape) for t, shape in
                           (("F16", (64, 8, 4)), ("F32", (64, 8, 2)), ("F32", (32, 8, 2)), ("F32", (64, 4, 2))))
    try:
        with CommandSequence(device) as seq, seq.record():
            with pytest.raises(OutOfRange, match="cannot ride"):
                norm_rope(seq, k, pos, kc, rows=pos, with_q=(q, qo, None), n_dims=64, freq_base=1e4,
                          attn_temp=(0.1, 8))
            with pytest.raises(OutOfRange, match="cannot ride"):
                norm_rope(seq, k, pos, kc, rows=pos, with_q=(q32, qo32, None), n_dims=64, freq_base=1e4)
            with pytest.raises(OutOfRange, match="cannot ride"):
                norm_rope(seq, k, pos, plain, with_q=(q, qo, None), n_dims=64, freq_base=1e4)
    finally:
        for t in (q, q32, k, pos, kc, qo, qo32, plain):
            t.close()


@pytest.mark.parametrize("kv", ["Q8_0", "Q4_0", "Q5_1", "IQ4_NL"])
@pytest.mark.parametrize("head_dim,k_rot,v_rot", [(64, 0, 0), (64, 64, 64), (128, 128, 64)])
def test_quantised_rotated_cache_same_bits(device, kv, head_dim, k_rot, v_rot):
    """A quantised cache stored rotated (ops/hadamard.py), the queries riding along: K's and V's
    blocks and the queries with the bits of rms_norm, rope, hadamard and set_rows apart; cells no
    token names keep what they held."""
    rng = np.random.default_rng(head_dim + k_rot + v_rot)
    k, v = ((rng.standard_normal((N_TOK, N_HEAD, head_dim)) * 3).astype(np.float32) for _ in range(2))
    k[:, 0, 5] = 40.0   # an outlier the rotation spreads
    q = (rng.standard_normal((N_TOK, 2 * N_HEAD, head_dim)) * 3).astype(np.float32)
    rows = np.array([3, 0, 10, 4, 7], np.int32)
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    kw, qw = (rng.uniform(0.5, 1.5, head_dim).astype(np.float32) for _ in range(2))
    own = [tensor_from_numpy(device, a) for a in (k, v, q, rows, pos, kw, qw, v)]
    tk, tv, tq, trows, tp, tkw, tqw, tv_rot = own
    caches = [Tensor.empty(device, kv, (head_dim, N_CELLS, N_HEAD)) for _ in range(4)]   # K, V apart; K, V fused
    qs = [Tensor.empty(device, "F32", q.shape[::-1]) for _ in range(2)]
    tmp = [Tensor.empty(device, "F32", k.shape[::-1]) for _ in range(2)]
    own += caches + qs + tmp
    args = dict(n_dims=head_dim, freq_base=1e4, neox=True)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                for c in caches:
                    seq.fill(c.range(), 0x3C003C00)
                rms_norm(seq, tk, tmp[0], 1e-6, tkw)
                rope(seq, tmp[0], tp, tmp[1], **args)
                rms_norm(seq, tq, qs[0], 1e-6, tqw)
                rope(seq, qs[0], tp, qs[0], **args)
                if k_rot:
                    hadamard(seq, tmp[1], k_rot)
                    hadamard(seq, qs[0], k_rot)
                if v_rot:
                    hadamard(seq, tv_rot, v_rot)
                set_rows(seq, tmp[1], trows, caches[0])
                set_rows(seq, tv_rot, trows, caches[1])
                norm_rope(seq, tk, tp, caches[2], weight=tkw, eps=1e-6, rows=trows, store_v=(tv, caches[3]),
                          with_q=(tq, qs[1], tqw), k_rot=k_rot, v_rot=v_rot, **args)
            seq.run()
        k_apart, v_apart, k_fused, v_fused = (read_tensor(c).view(np.uint8) for c in caches)
        q_apart, q_fused = (read_tensor(t) for t in qs)
    finally:
        for t in own:
            t.close()
    np.testing.assert_array_equal(k_apart, k_fused)
    np.testing.assert_array_equal(v_apart, v_fused)
    np.testing.assert_array_equal(q_apart.view(np.uint32), q_fused.view(np.uint32))
    assert not np.array_equal(k_apart, v_apart)

