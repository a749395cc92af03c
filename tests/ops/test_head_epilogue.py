"""The per-head epilogue of a projection's mat-vec (mul_mv HEAD_EPI, vkrt/ops/head_epilogue.py):
each head's norm, RoPE and store, by the last workgroup of its rows (or the workgroup holding
whole heads), give norm_rope's bits after the plain mat-vec; replays find the counters at 0."""

import dataclasses

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.device.tuning import TABLE, Arch
from vkrt.errors import UnsupportedShape
from vkrt.memory import F32, I32, Tensor
from vkrt.ops.head_epilogue import head_epilogue
from vkrt.ops.matmul import head_epilogue_fits, mat_vec_shape, matmul
from vkrt.ops.norm_rope import norm_rope
from vkrt.ops.quant import kernel_type
from vkrt.ops.set_rows import set_rows

N_CELLS = 9
# the tuning fields that decide a mat-vec's rows a workgroup (and the norm's workgroup), pinned to
# lavapipe's table so that CASES take both epilogue paths on every device
SHAPE_FIELDS = ("mv_wg", "mv_rows", "mv_rows_by_type", "mv_rows_one_column_by_type", "mv_rows_multi",
                "mv_fill_groups", "mv_max_n", "mv_dense_max_n", "reduce_wg")


@pytest.fixture
def lavapipe_shapes(device, monkeypatch):
    lp = TABLE[Arch.LLVMPIPE].resolved(device.profile)
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, **{f: getattr(lp, f) for f in SHAPE_FIELDS}))

CASES = [
    # (head_dim, block, heads, K, tokens, norm, rope, cache, sections, freq factors)
    (64, 64, 3, 512, 1, True, "neox", None, None, False),          # several workgroups a head: counters
    (64, 128, 2, 512, 2, True, "neox", None, (8, 8, 8, 0), False),   # a gated query's blocks, IMROPE
    (64, 64, 2, 512, 3, True, "neox", "F16", None, False),         # K into an f16 cache
    (32, 32, 4, 256, 1, False, "normal", "F32", None, True),       # no norm, frequency factors
    (64, 64, 2, 512, 2, False, None, "F16", None, False),          # V: the store alone
    (16, 16, 4, 64, 2, True, "neox", "F16", None, False),          # whole heads a workgroup
]


def _inputs(device, rng, head_dim, block, heads, k, tokens, sections, ff):
    w = (rng.standard_normal((heads * block, k)) * 0.05).astype(np.float32)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    pos = rng.integers(0, 3000, tokens * (4 if sections else 1)).astype(np.int32)
    rows = rng.permutation(N_CELLS)[:tokens].astype(np.int32)
    norm_w = rng.uniform(0.5, 1.5, head_dim).astype(np.float32)
    factors = rng.uniform(1.0, 4.0, head_dim // 2).astype(np.float32)
    return [tensor_from_numpy(device, a) for a in (w, x, pos, rows, norm_w, factors)]


@pytest.mark.parametrize("head_dim,block,heads,k,tokens,norm,rope,cache,sections,ff", CASES)
def test_same_bits_as_norm_rope_after_the_mat_vec(device, lavapipe_shapes, head_dim, block, heads, k, tokens, norm,
                                                 rope, cache, sections, ff):
    same_bits(device, head_dim, block, heads, k, tokens, norm, rope, cache, sections, ff)


@pytest.mark.parametrize("case", [0, 2])
def test_same_bits_with_the_device_tuning(device, case):
    """As above, with the device's own mat-vec and norm workgroups (the H200's: 128-invocation
    mat-vecs redoing a 64-invocation norm's sums)."""
    head_dim, block, heads, k, tokens, *rest = CASES[case]
    same_bits(device, 128, 128, heads, 2048, tokens, *rest)


def same_bits(device, head_dim, block, heads, k, tokens, norm, rope, cache, sections, ff):
    rng = np.random.default_rng(head_dim + block + k + tokens)
    own = _inputs(device, rng, head_dim, block, heads, k, tokens, sections, ff)
    tw, tx, tpos, trows, tnorm, tff = own
    m = heads * block
    args = dict(n_dims=head_dim, freq_base=10000.0, neox=rope == "neox", freq_factors=tff if ff else None)
    if sections:
        args.update(sections=sections, interleaved=True)
    shape = (head_dim, N_CELLS, heads) if cache else (head_dim, heads, tokens)
    outs = [Tensor.empty(device, cache or "F32", shape) for _ in range(2)]
    ys = [Tensor.empty(device, "F32", (m, tokens)) for _ in range(2)]
    counters = tensor_from_numpy(device, np.zeros(heads, np.int32))
    own += outs + ys + [counters]
    try:
        assert head_epilogue_fits(device, tw, tokens, block)
        with CommandSequence(device) as seq:
            epi = head_epilogue(seq, ys[1], head_dim, counters, outs[1], block=block, weight=tnorm if norm else None,
                                eps=1e-6, positions=tpos if rope else None, rows=trows if cache else None,
                                rope_args=args)
            assert epi is not None
            with seq.record():
                for o in outs:   # cells no token writes must match too
                    seq.fill(o.range(), 0)
                matmul(seq, tw, tx, ys[0])
                y3 = ys[0].view((head_dim, heads, tokens), nb=(4, 4 * block, 4 * m))
                if rope:
                    norm_rope(seq, y3, tpos, outs[0], weight=tnorm if norm else None, eps=1e-6,
                              rows=trows if cache else None, **args)
                else:
                    set_rows(seq, y3, trows, outs[0])
                matmul(seq, tw, tx, ys[1], head_epi=epi)
            for _ in range(2):   # a replay: the counters were left at 0
                seq.run()
                want, got = (read_tensor(o) for o in outs)
                assert np.array_equal(want.view(np.uint8), got.view(np.uint8))
                assert np.array_equal(read_tensor(ys[0]).view(np.uint32), read_tensor(ys[1]).view(np.uint32))
                assert not read_tensor(counters).any()
    finally:
        for t in own:
            t.close()


def test_counter_path_is_exercised(device, lavapipe_shapes):
    """The CASES include heads counted over several workgroups and workgroups of whole heads on
    this device's tuning (else the test above would not cover both epilogue paths)."""
    per = []
    for head_dim, block, heads, k, tokens, *_ in CASES:
        wg, lanes, rows = mat_vec_shape(device, kernel_type(F32), tokens, device.tuning, k=k, m=heads * block)
        per.append(block // (rows * (wg // lanes)))
    assert max(per) > 1 and min(per) <= 1   # <= 1: a workgroup holds whole heads


def test_refusals(device):
    """What the epilogue cannot give norm_rope's bits for is refused (None), and matmul refuses
    an epilogue its workgroups cannot count."""
    rng = np.random.default_rng(1)
    own = _inputs(device, rng, 64, 64, 2, 512, 1, None, False)
    tw, tx, tpos, trows, tnorm, tff = own
    y = Tensor.empty(device, "F32", (128, 1))
    out = Tensor.empty(device, "F32", (64, 2, 1))
    counters = Tensor.empty(device, I32, (2,))
    own += [y, out, counters]
    try:
        seq = CommandSequence(device)
        args = dict(n_dims=64, freq_base=10000.0, neox=True)
        assert head_epilogue(seq, y, 64, counters, out, positions=tpos, rope_args=dict(args, attn_temp=(0.1, 8))) is None
        assert head_epilogue(seq, y, 64, counters.slice(0, 0, 1), out, positions=tpos, rope_args=args) is None
        assert head_epilogue(seq, y, 48, counters, out, positions=tpos, rope_args=args) is None   # 128 % 48
        bad = dataclasses.replace(device.tuning, mv_max_n=1, mv_dense_max_n=1)
        epi = head_epilogue(seq, y, 64, counters, out, positions=tpos, rope_args=args)
        x2, y2 = Tensor.empty(device, "F32", (512, 2)), Tensor.empty(device, "F32", (128, 2))
        own += [x2, y2]
        with pytest.raises(UnsupportedShape, match="one mat-vec run"):
            matmul(seq, tw, x2, y2, head_epi=epi, tuning=bad)
        with pytest.raises(UnsupportedShape, match="one mat-vec run"):   # a slice of a GEMM-sized product
            matmul(seq, tw, tx, y, head_epi=epi, kernel_columns=512)
    finally:
        for t in own:
            t.close()
