"""RoPE, NORMAL and NEOX, partial rotation, frequency factors and YaRN, against float64 numpy."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy, write_tensor


def rope_ref(x, pos, n_dims, base, freq_scale, neox, ff=None, attn_factor=1.0):
    """x [n_tok, n_head, head_dim]; pos [n_tok] or, one position per pair, [n_tok, n_dims / 2]."""
    x = x.astype(np.float64)
    y = x.copy()
    half = n_dims // 2
    i = np.arange(half)
    pos = pos.astype(np.float64)
    pos = pos if pos.ndim == 2 else pos[:, None]
    theta = pos * base ** (-2.0 * i / n_dims) * freq_scale
    if ff is not None:
        theta = theta / ff[:half]
    c, s = np.cos(theta)[:, None, :] * attn_factor, np.sin(theta)[:, None, :] * attn_factor
    if neox:
        a, b = x[..., :half], x[..., half:n_dims]
        y[..., :half], y[..., half:n_dims] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        y[..., 0:n_dims:2], y[..., 1:n_dims:2] = a * c - b * s, a * s + b * c
    return y


def mrope_streams(n_dims, sections, interleaved):
    """The position stream (0 t, 1 h, 2 w, 3 e) of each pair, transcribed from ggml's
    ggml_mrope_cache_init (ggml-cpu/ops.cpp)."""
    sect_dims = sum(sections)
    sec_w = sections[0] + sections[1]
    sec_e = sec_w + sections[2]
    streams = []
    for i0 in range(0, n_dims, 2):
        sector = (i0 // 2) % sect_dims
        if interleaved:
            if sector % 3 == 1 and sector < 3 * sections[1]:
                k = 1
            elif sector % 3 == 2 and sector < 3 * sections[2]:
                k = 2
            elif sector % 3 == 0 and sector < 3 * sections[0]:
                k = 0
            else:
                k = 3
        else:
            k = 0
            if sections[0] <= sector < sec_w:
                k = 1
            elif sec_w <= sector < sec_e:
                k = 2
            elif sector >= sec_e:
                k = 3
        streams.append(k)
    return np.array(streams)


def rope_multi_ref(x, pos4, n_dims, base, sections, interleaved, freq_scale=1.0, ff=None, attn_factor=1.0):
    """ggml's rope_multi (MROPE / IMROPE): NEOX pairs (rotate_pairs(n_dims, n_dims / 2)), pair i
    rotated by the stream mrope_streams picks; pos4 I32 [4 * n_tok]: streams t, h, w, e."""
    per_stream = pos4.reshape(4, x.shape[0])
    pos = per_stream[mrope_streams(n_dims, sections, interleaved)].T   # [n_tok, n_dims / 2]
    return rope_ref(x, pos, n_dims, base, freq_scale, True, ff, attn_factor)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("head_dim, n_dims", [(64, 64), (128, 64), (256, 256)])
def test_rope(device, neox, head_dim, n_dims):
    from vkrt.ops.rope import rope
    rng = np.random.default_rng(head_dim + n_dims + neox)
    n_tok, n_head = 5, 3
    x = rng.standard_normal((n_tok, n_head, head_dim)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 4095], np.int32)
    tx, tp = tensor_from_numpy(device, x), tensor_from_numpy(device, pos)
    to = tensor_from_numpy(device, np.zeros_like(x))
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                rope(seq, tx, tp, to, n_dims=n_dims, freq_base=10000.0, neox=neox)
            seq.run()
            np.testing.assert_allclose(read_tensor(to), rope_ref(x, pos, n_dims, 1e4, 1.0, neox), atol=2.5e-3)  # fp32 theta near 4096 rad: a few ulps (4.9e-4 each)
            pos2 = pos + 3  # replay with new positions: no re-recording
            write_tensor(tp, pos2)
            seq.run()
            np.testing.assert_allclose(read_tensor(to), rope_ref(x, pos2, n_dims, 1e4, 1.0, neox), atol=2.5e-3)  # fp32 theta near 4096 rad: a few ulps (4.9e-4 each)
    finally:
        for t in (tx, tp, to):
            t.close()


def test_rope_freq_scale_and_factors(device):
    from vkrt.ops.rope import rope
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 2, 32)).astype(np.float32)
    pos = np.arange(4, dtype=np.int32) * 13
    ff = (1 + rng.random(16) * 4).astype(np.float32)
    tx, tp, tf = tensor_from_numpy(device, x), tensor_from_numpy(device, pos), tensor_from_numpy(device, ff)
    to = tensor_from_numpy(device, np.zeros_like(x))
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                rope(seq, tx, tp, to, n_dims=32, freq_base=500000.0, freq_scale=0.25, neox=True, freq_factors=tf)
            seq.run()
        np.testing.assert_allclose(read_tensor(to), rope_ref(x, pos, 32, 5e5, 0.25, True, ff), atol=2.5e-3)  # fp32 theta near 4096 rad: a few ulps (4.9e-4 each)
    finally:
        for t in (tx, tp, tf, to):
            t.close()



@pytest.mark.parametrize("n_dims", [32, 16])
def test_rope_attention_temperature(device, n_dims):
    """The attention temperature (mistral3's queries): after the rotation, every value of the
    token at position p (rotated or passed through) times log(floor(p / floor) + 1) * scale + 1:
    1 below position floor, then growing by steps."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 2, 32)).astype(np.float32)
    pos = np.array([0, 6, 7, 8, 15, 100], np.int32)
    temp = np.log(np.floor(pos / 8) + 1) * 0.1 + 1
    assert np.all(temp[:3] == 1) and np.all(temp[3:] > 1)
    got = run_rope(device, x, pos, n_dims=n_dims, freq_base=10000.0, neox=False, attn_temp=(0.1, 8))
    want = rope_ref(x, pos, n_dims, 10000.0, 1.0, False) * temp[:, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    plain = run_rope(device, x, pos, n_dims=n_dims, freq_base=10000.0, neox=False)
    np.testing.assert_array_equal(got[:3], plain[:3])   # a factor of 1: the same bits


def position_streams(rng, n_tok):
    """I32 [4 * n_tok]: distinct t, h, w, e streams (e mostly 0, as llama.cpp sets it for text)."""
    t = np.array([0, 1, 7, 100, 4095, 31, 2000][:n_tok], np.int32)
    h, w = rng.integers(0, 3000, n_tok), rng.integers(0, 3000, n_tok)
    e = np.zeros(n_tok, np.int64)
    e[-1] = 1234
    return np.concatenate([t, h, w, e]).astype(np.int32)


def run_rope(device, x, pos, **args):
    from vkrt.ops.rope import rope
    own = [tensor_from_numpy(device, a) for a in (x, pos)]
    if args.get("freq_factors") is not None:
        own.append(tensor_from_numpy(device, args["freq_factors"]))
        args = dict(args, freq_factors=own[-1])
    out = tensor_from_numpy(device, np.zeros_like(x))
    own.append(out)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                rope(seq, own[0], own[1], out, **args)
            seq.run()
        return read_tensor(out)
    finally:
        for t in own:
            t.close()


SECTIONED = [(64, 16, (3, 3, 2, 0)),      # partial rotation, 8 pairs
             (256, 64, (11, 11, 10, 0)),  # qwen35's full-attention heads
             (64, 32, (2, 3, 1, 1))]      # 16 pairs over sectors 0..6 twice: the e stream rotates some


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("head_dim, n_dims, sections", SECTIONED)
def test_rope_sectioned(device, interleaved, head_dim, n_dims, sections):
    rng = np.random.default_rng(head_dim + n_dims + interleaved)
    n_tok = 5
    x = rng.standard_normal((n_tok, 3, head_dim)).astype(np.float32)
    pos = position_streams(rng, n_tok)
    args = dict(n_dims=n_dims, freq_base=1e4, sections=sections, interleaved=interleaved)
    got = run_rope(device, x, pos, **args)
    want = rope_multi_ref(x, pos, n_dims, 1e4, sections, interleaved)
    np.testing.assert_allclose(got, want, atol=2.5e-3)  # fp32 theta near 4096 rad: a few ulps (4.9e-4 each)
    np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])
    # the streams matter for this data: rotating every pair by the t stream alone is far off
    assert np.abs(got - rope_ref(x, pos[:n_tok], n_dims, 1e4, 1.0, True)).max() > 0.05


def test_rope_sectioned_scales_and_factors(device):
    rng = np.random.default_rng(2)
    head_dim, n_dims, sections, n_tok = 64, 16, (3, 3, 2, 0), 4
    x = rng.standard_normal((n_tok, 2, head_dim)).astype(np.float32)
    pos = position_streams(rng, n_tok)
    ff = (1 + rng.random(n_dims // 2) * 4).astype(np.float32)
    got = run_rope(device, x, pos, n_dims=n_dims, freq_base=5e5, freq_scale=0.25, freq_factors=ff, attn_factor=1.5,
                   sections=sections, interleaved=True)
    want = rope_multi_ref(x, pos, n_dims, 5e5, sections, True, 0.25, ff, 1.5)
    np.testing.assert_allclose(got, want, atol=4e-3)  # 1.5 x the unscaled bound


def test_imrope_of_text_is_neox(device):
    """llama.cpp's text positions (t = h = w = position, e = 0) make IMROPE plain NEOX rope."""
    rng = np.random.default_rng(3)
    n_tok = 6
    x = rng.standard_normal((n_tok, 2, 256)).astype(np.float32)
    p = np.array([0, 1, 2, 77, 4000, 65535], np.int32)
    pos4 = np.concatenate([p, p, p, np.zeros_like(p)])
    sectioned = run_rope(device, x, pos4, n_dims=64, freq_base=1e7, sections=(11, 11, 10, 0), interleaved=True)
    neox = run_rope(device, x, p, n_dims=64, freq_base=1e7, neox=True)
    np.testing.assert_array_equal(sectioned, neox)   # the same position per pair: the same bits


def test_rope_sectioned_argument_errors(device):
    from vkrt.errors import GGMLTypeError, OutOfRange
    from vkrt.ops.rope import rope
    x = tensor_from_numpy(device, np.zeros((3, 2, 64), np.float32))
    pos = tensor_from_numpy(device, np.zeros(11, np.int32))   # 4 streams of 3 need 12
    out = tensor_from_numpy(device, np.zeros((3, 2, 64), np.float32))
    args = dict(n_dims=16, freq_base=1e4)
    try:
        with CommandSequence(device) as seq, seq.record():
            with pytest.raises(GGMLTypeError, match="4 streams"):
                rope(seq, x, pos, out, sections=(3, 3, 2, 0), **args)
            with pytest.raises(OutOfRange, match="NEOX"):
                rope(seq, x, pos, out, sections=(3, 3, 2, 0), neox=False, **args)
            with pytest.raises(OutOfRange, match="needs sections"):
                rope(seq, x, pos, out, interleaved=True, **args)
            for bad in ((0, 0, 0, 0), (3, 3, 2), (3, -1, 2, 0), (40, 40, 0, 0)):
                with pytest.raises(OutOfRange, match="sections must be"):
                    rope(seq, x, pos, out, sections=bad, **args)
    finally:
        for t in (x, pos, out):
            t.close()


def yarn_corr_dims_ref(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    """ggml_rope_yarn_corr_dims in float64."""
    def corr_dim(n_rot):
        return n_dims * np.log(n_ctx_orig / (n_rot * 2 * np.pi)) / (2 * np.log(base))
    return max(0.0, np.floor(corr_dim(beta_fast))), min(n_dims - 1.0, np.ceil(corr_dim(beta_slow)))


def rope_yarn_ref(x, pos, n_dims, base, freq_scale, ext_factor, attn_factor, n_ctx_orig, beta_fast=32.0, beta_slow=1.0):
    """NEOX RoPE with ggml's rope_yarn (ggml-cpu ops.cpp) per pair i: theta_extrap = pos * base^(-2i/n),
    theta_interp = freq_scale * theta_extrap, mixed by ramp(i) * ext_factor where the ramp falls
    from 1 to 0 between the correction dims; cos and sin times attn_factor * (1 + 0.1 ln(1/freq_scale))."""
    x = x.astype(np.float64)
    y = x.copy()
    half = n_dims // 2
    i = np.arange(half)
    low, high = yarn_corr_dims_ref(n_dims, n_ctx_orig, base, beta_fast, beta_slow)
    ramp = (1 - np.clip((i - low) / max(0.001, high - low), 0, 1)) * ext_factor
    extrap = pos.astype(np.float64)[:, None] * base ** (-2.0 * i / n_dims)
    theta = freq_scale * extrap * (1 - ramp) + extrap * ramp
    mscale = attn_factor * (1 + 0.1 * np.log(1 / freq_scale)) if ext_factor else attn_factor
    c, s = np.cos(theta)[:, None, :] * mscale, np.sin(theta)[:, None, :] * mscale
    a, b = x[..., :half], x[..., half:n_dims]
    y[..., :half], y[..., half:n_dims] = a * c - b * s, a * s + b * c
    return y


@pytest.mark.parametrize("n_dims,base,factor,n_ctx_orig", [(64, 150000.0, 32.0, 4096), (128, 1e6, 4.0, 32768),
                                                           (32, 10000.0, 8.0, 2048)])
def test_rope_yarn(device, n_dims, base, factor, n_ctx_orig):
    """YaRN (gpt-oss: head 64, base 150000, factor 32 over 4096) against the numpy port of ggml's
    rope_yarn; the correction dims as ggml computes them; far from linear scaling alone."""
    from vkrt.ops.rope import yarn_corr_dims
    rng = np.random.default_rng(n_dims)
    x = rng.standard_normal((6, 3, n_dims + 16)).astype(np.float32)
    pos = np.array([0, 1, 5, 130, 2047, 4000], np.int32)
    args = dict(n_dims=n_dims, freq_base=base, freq_scale=1 / factor, neox=True, ext_factor=1.0,
                n_ctx_orig=n_ctx_orig, attn_factor=0.9)
    got = run_rope(device, x, pos, **args)
    want = rope_yarn_ref(x, pos, n_dims, base, 1 / factor, 1.0, 0.9, n_ctx_orig)
    assert yarn_corr_dims(n_dims, n_ctx_orig, base, 32.0, 1.0) == yarn_corr_dims_ref(n_dims, n_ctx_orig, base, 32, 1)
    np.testing.assert_allclose(got, want, atol=4e-3)  # fp32 theta near 4096 rad, times mscale up to 1.3
    np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])
    linear = rope_ref(x, pos, n_dims, base, 1 / factor, True)
    assert np.abs(got - linear).max() > 0.1
    if (n_dims, factor) == (64, 32.0):
        assert yarn_corr_dims(64, 4096, 150000.0, 32.0, 1.0) == (8.0, 18.0)   # gpt-oss's


def test_rope_yarn_needs_the_original_context(device):
    from vkrt.errors import OutOfRange
    with pytest.raises(OutOfRange, match="original context"):
        run_rope(device, np.zeros((2, 1, 64), np.float32), np.zeros(2, np.int32), n_dims=64, freq_base=1e4,
                 ext_factor=1.0)
