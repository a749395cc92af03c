"""Flash attention against a float64 reference; mask_opt on vs off bit for bit; split-K; layouts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attn_reference import NEG_INF, alibi_mask, attention_reference, causal_mask, make_qkv, nmse, random_mask

from vkrt.commands import CommandSequence, download, read_tensor, tensor_from_numpy, upload
from vkrt.device.architecture import Arch
from vkrt.device.tune import tuning_for
from vkrt.errors import UnsupportedShape
from vkrt.memory import F16, F32, Tensor
from vkrt.ops.flash_attn import FlashAttn
from vkrt.ops.flash_work import FlashWork
from vkrt.ops.hadamard import hadamard

TOL = 1e-11  # NMSE; lavapipe measures up to 2e-13 (fp32 arithmetic against float64)
TOL_TANH = 1e-8  # drivers' tanh may be coarser than their exp


def tuning(device, arch: Arch | None):
    """The lavapipe table entry, or another architecture's resolved for this device; loops stay
    rolled (the same code, minus minutes of LLVM compile time on lavapipe)."""
    if arch is None:
        return device.tuning
    t = tuning_for(dataclasses.replace(device.profile, architecture=arch))
    return dataclasses.replace(t, fa_unroll=False)


def flash(device, q, k, v, mask=None, *, scale=None, **kw):
    """Run FlashAttn on numpy inputs; returns (out in numpy order (batch, n_q, n_head, hsv), the op).
    The scalar kernel unless `coopmat` says otherwise (test_flash_attn_cm.py tests the other)."""
    kw.setdefault("coopmat", False)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    inputs = [tensor_from_numpy(device, a) for a in (q, k, v)]
    tm = tensor_from_numpy(device, mask) if mask is not None else None
    out = Tensor.empty(device, F32, (v.shape[-1], q.shape[1], q.shape[2], q.shape[0]))
    try:
        with FlashWork(device) as work, CommandSequence(device) as seq:
            fa = FlashAttn(device, *inputs, out, tm, scale=scale, work=work, **kw)
            with seq.record():
                fa.record(seq)
            seq.run()
            return read_tensor(out), fa
    finally:
        for t in (*inputs, tm, out):
            if t is not None:
                t.close()


def check(got, q, k, v, mask=None, *, scale=None, tol=TOL, **kw):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ref = attention_reference(q, k, v, mask, scale=scale, **kw)
    assert np.isfinite(got).all()
    err = nmse(got, ref)
    assert err < tol, f"NMSE {err:.3g} >= {tol:.1g}"
    return ref


HEADS = [(64, 64), (80, 80), (96, 96), (112, 112), (128, 128), (192, 192), (256, 256), (192, 128), (40, 72), (8, 8)]


@pytest.mark.parametrize("hsk,hsv", HEADS)
def test_head_sizes(device, hsk, hsv):
    rng = np.random.default_rng(hsk * 1000 + hsv)
    q, k, v = make_qkv(rng, n_q=19, n_kv=70, hsk=hsk, hsv=hsv)
    mask = causal_mask(19, 70)
    got, _ = flash(device, q, k, v, mask)
    check(got, q, k, v, mask)


LAYOUTS = [(Arch.AMD_GCN, 64, 64), (Arch.AMD_GCN, 80, 80), (Arch.AMD_GCN, 256, 256), (Arch.AMD_GCN, 192, 128),
           (Arch.NVIDIA, 128, 128), (Arch.NVIDIA, 72, 72)]


@pytest.mark.parametrize("arch,hsk,hsv", LAYOUTS)
def test_other_architectures_layouts(device, arch, hsk, hsv):
    """GCN's 256-invocation workgroups (four row groups, 8 dot lanes with shuffles) and NVIDIA's,
    run here on lavapipe."""
    rng = np.random.default_rng(hsk + 7)
    q, k, v = make_qkv(rng, n_q=21, n_kv=90, hsk=hsk, hsv=hsv)
    mask = causal_mask(21, 90)
    got, fa = flash(device, q, k, v, mask, tuning=tuning(device, arch))
    wg = dict(fa.tuning.fa_prompt_wg_by_head).get(hsv, fa.tuning.fa_wg) if hsk == hsv else fa.tuning.fa_wg
    assert fa.tile.wg == wg and fa.tile.d_split > 1
    check(got, q, k, v, mask)


@pytest.mark.parametrize("gqa", [1, 2, 4, 8])
def test_gqa(device, gqa):
    rng = np.random.default_rng(gqa)
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=8 // gqa, n_q=12, n_kv=50)
    mask = causal_mask(12, 50)
    got, _ = flash(device, q, k, v, mask)
    check(got, q, k, v, mask)


def _masks(rng, n_q, n_kv):
    return {
        "none": None,
        "causal": causal_mask(n_q, n_kv),
        "padded": causal_mask(n_q, n_kv, pad_to=32),
        "window": causal_mask(n_q, n_kv, window=24),
        "random": random_mask(rng, n_q, n_kv),
        "dead_rows": random_mask(rng, n_q, n_kv, dead_rows=(0, 5, n_q - 1)),
    }


@pytest.mark.parametrize("kind", ["none", "causal", "padded", "window", "random", "dead_rows"])
def test_masks(device, kind):
    rng = np.random.default_rng(len(kind))
    q, k, v = make_qkv(rng, n_q=17, n_kv=100)
    mask = _masks(rng, 17, 100)[kind]
    got, _ = flash(device, q, k, v, mask)
    ref = check(got, q, k, v, mask)
    if kind == "dead_rows":
        assert (got[:, [0, 5, 16]] == 0).all() and (ref[:, [0, 5, 16]] == 0).all()


@pytest.mark.parametrize("k_dtype,v_dtype", [(np.float16, np.float16), (np.float32, np.float32),
                                             (np.float16, np.float32), (np.float32, np.float16)])
def test_kv_types(device, k_dtype, v_dtype):
    rng = np.random.default_rng(3)
    q, k, v = make_qkv(rng, n_q=9, n_kv=45, hsk=96)
    k, v = k.astype(k_dtype), v.astype(v_dtype)
    mask = causal_mask(9, 45)
    got, _ = flash(device, q, k, v, mask)
    check(got, q, k, v, mask)


@pytest.mark.parametrize("softcap,max_bias,scale", [(30.0, 0.0, 0.125), (0.0, 8.0, 0.125), (20.0, 4.0, 0.3)])
def test_softcap_alibi_scale(device, softcap, max_bias, scale):
    """Six heads: ALiBi's slopes for heads below and above the largest power of two."""
    rng = np.random.default_rng(int(softcap + max_bias))
    q, k, v = make_qkv(rng, n_head=6, n_head_kv=3, n_q=10, n_kv=40)
    q *= 4  # scores large enough that softcap bends them
    alibi = alibi_mask(10, 40)
    got, _ = flash(device, q, k, v, alibi, scale=scale, softcap=softcap, max_bias=max_bias)
    check(got, q, k, v, alibi, scale=scale, softcap=softcap, max_bias=max_bias, tol=TOL_TANH if softcap else TOL)
    if softcap:
        plain = attention_reference(q, k, v, alibi, scale=scale, max_bias=max_bias)
        assert nmse(got, plain) > 1e-4  # the softcap really changed the result


@pytest.mark.parametrize("n_kv,split_k,expect", [(700, 1, 1), (700, 2, 2), (700, 5, 5), (700, None, None),
                                                 (20, 3, 1), (2000, 21, 21)])
def test_split_k(device, n_kv, split_k, expect):
    """21 splits: the merge folds them 8 at a time (MERGE_AT), a later chunk raising the max."""
    rng = np.random.default_rng(n_kv + (split_k or 0))
    q, k, v = make_qkv(rng, n_head=2, n_head_kv=1, n_q=20, n_kv=n_kv)   # more queries than a packed decode
    mask = random_mask(rng, 20, n_kv, masked=0.5, dead_rows=(2,))
    mask[0, 0, 3, :n_kv // 2] = NEG_INF  # row 3's first splits see nothing
    mask[0, 0, 4, -n_kv // 8:] += 6.0    # row 4's largest scores in its last splits
    got, fa = flash(device, q, k, v, mask, split_k=split_k)
    if expect is None:  # a 2 x 2 grid is far below fa_fill_groups: split automatically
        assert fa.n_split > 1
    else:
        assert fa.n_split == expect
    check(got, q, k, v, mask)
    assert (got[:, 2] == 0).all()


def test_split_merge_replays(device):
    """The last split of a row tile merges the splits and resets its count: a recorded split
    attention replayed gives the right answer every time, also after its inputs change."""
    rng = np.random.default_rng(21)
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=3, n_kv=400)
    mask = causal_mask(3, 400)
    ts = [tensor_from_numpy(device, a) for a in (q, k, v, mask)]
    out = Tensor.empty(device, F32, (64, 4, 3, 1))
    try:
        with FlashWork(device) as work, CommandSequence(device) as seq:
            fa = FlashAttn(device, *ts[:3], out, ts[3], scale=0.125, split_k=5, work=work, coopmat=False)
            assert fa.n_split == 5
            with seq.record():
                fa.record(seq)
            for rep in range(3):
                if rep == 2:
                    q = rng.standard_normal(q.shape, dtype=np.float32)
                    upload(device, ts[0].range(), q)
                seq.run()
                check(read_tensor(out), q, k, v, mask, scale=0.125)
            assert not download(device, fa._done, np.uint32).any()
    finally:
        for t in (*ts, out):
            t.close()


def test_attention_ops_share_one_work(device):
    """Split attentions over one FlashWork (as a model's layers over the engine's) in one
    sequence; a later, larger one grows the work's buffers and the sequence recorded before
    still reads its own."""
    rng = np.random.default_rng(23)
    shapes = [(3, 400, 5), (2, 200, 3), (4, 800, 7)]   # (n_q, n_kv, split_k): the third needs the most
    data = [(make_qkv(rng, n_head=4, n_head_kv=2, n_q=n_q, n_kv=n_kv), causal_mask(n_q, n_kv))
            for n_q, n_kv, _ in shapes]
    ts = [[tensor_from_numpy(device, a) for a in (*qkv, mask)] for qkv, mask in data]
    outs = [Tensor.empty(device, F32, (64, 4, n_q, 1)) for n_q, _, _ in shapes]
    seqs = [CommandSequence(device), CommandSequence(device)]
    parts = []   # where each op's split partials are
    try:
        with FlashWork(device) as work:
            for seq, ops in zip(seqs, ([0, 1], [2])):
                with seq.record():
                    for i in ops:
                        fa = FlashAttn(device, *ts[i][:3], outs[i], ts[i][3], scale=0.125, split_k=shapes[i][2],
                                       coopmat=False, work=work)
                        assert fa.n_split > 1
                        fa.record(seq)
                        parts.append((fa._part.buffer, fa._part.offset))
                        done = fa._done
            assert parts[0] == parts[1] != parts[2]
            for seq in (*seqs, seqs[0]):
                seq.run()
            for (qkv, mask), out in zip(data, outs):
                check(read_tensor(out), *qkv, mask, scale=0.125)
            assert not download(device, done, np.uint32).any()
    finally:
        for t in (*(t for group in ts for t in group), *outs, *seqs):
            t.close()


def test_strided_views(device):
    """Q as a permuted view of a [hsk, n_head, n_q] projection; K and V as views of a KV cache
    [hsk * n_head_kv, n_ctx] holding more cells than the attention reads."""
    rng = np.random.default_rng(11)
    n_q, n_kv, n_ctx, hs, n_head, n_head_kv = 13, 40, 64, 64, 4, 2
    q, k, v = make_qkv(rng, n_head=n_head, n_head_kv=n_head_kv, n_q=n_q, n_kv=n_kv, hsk=hs)
    mask = causal_mask(n_q, n_kv)
    q_proj = tensor_from_numpy(device, np.ascontiguousarray(q[0].transpose(1, 0, 2)))  # (n_q, n_head, hs)
    caches = []
    for a in (k, v):
        cache = np.zeros((n_ctx, n_head_kv, hs), np.float16)
        cache[:n_kv] = a[0].transpose(1, 0, 2)
        caches.append(tensor_from_numpy(device, cache))
    tm = tensor_from_numpy(device, mask)
    out = Tensor.empty(device, F32, (hs, n_head, n_q, 1))
    try:
        tq = q_proj.permute(0, 2, 1, 3)
        tk, tv = (c.permute(0, 2, 1, 3).slice(1, 0, n_kv) for c in caches)
        assert not tq.is_contiguous() and not tk.is_contiguous()
        with FlashWork(device) as work, CommandSequence(device) as seq:
            fa = FlashAttn(device, tq, tk, tv, out, tm, scale=hs ** -0.5, work=work, coopmat=False)
            with seq.record():
                fa.record(seq)
            seq.run()
        check(read_tensor(out), q, k, v, mask)
    finally:
        for t in (q_proj, *caches, tm, out):
            t.close()


def test_mask_planes_per_head_and_batch(device):
    rng = np.random.default_rng(5)
    q, k, v = make_qkv(rng, batch=2, n_head=4, n_head_kv=2, n_q=8, n_kv=60)
    mask = np.concatenate([random_mask(rng, 8, 60) for _ in range(4)], axis=1)  # (1, 4, 8, 60): one per head
    mask = np.concatenate([mask, causal_mask(8, 60).repeat(4, axis=1)], axis=0)  # (2, 4, 8, 60): per batch
    got, _ = flash(device, q, k, v, mask)
    check(got, q, k, v, mask)


# -- GQA packing and live cells ---------------------------------------------------------------------

PACK_CASES = [
    # (tuning, n_q, n_head, n_head_kv, head size, mask_opt, split_k)
    (None, 1, 8, 1, 128, False, 1),
    (None, 3, 8, 2, 64, False, 2),
    (None, 40, 4, 1, 64, True, 1),        # mask_opt blocks of Br / 4 token rows
    (Arch.AMD_GCN, 1, 16, 2, 256, False, 3),
    (Arch.AMD_GCN, 5, 8, 2, 128, False, 1),
    (Arch.NVIDIA, 1, 16, 2, 256, False, 1),   # Br 4 < 8 heads: two workgroups a KV head
    (Arch.NVIDIA, 9, 32, 8, 128, True, 2),
]


@pytest.mark.parametrize("arch,n_q,n_head,n_head_kv,hs,mask_opt,split_k", PACK_CASES)
def test_gqa_pack_bit_identical(device, arch, n_q, n_head, n_head_kv, hs, mask_opt, split_k):
    """The query heads of a KV head in one workgroup give the unpacked result bit for bit."""
    rng = np.random.default_rng(n_q * 100 + n_head)
    n_kv = 700 if mask_opt else 300
    q, k, v = make_qkv(rng, n_head=n_head, n_head_kv=n_head_kv, n_q=n_q, n_kv=n_kv, hsk=hs)
    mask = causal_mask(n_q, n_kv, window=250)
    kw = dict(tuning=tuning(device, arch), split_k=split_k, mask_opt=mask_opt)
    packed, fa = flash(device, q, k, v, mask, gqa_pack=True, **kw)
    plain, fb = flash(device, q, k, v, mask, gqa_pack=False, **kw)
    assert fa.pack == n_head // n_head_kv and fb.pack == 1 and fa.mask_opt == mask_opt
    assert fa.tile.br % fa.pack == 0 or fa.pack % fa.tile.br == 0
    check(packed, q, k, v, mask)
    assert np.array_equal(_bits(packed), _bits(plain))


LOADS_FIRST_CASES = [
    # (tuning, n_q, n_head, n_head_kv, head size, mask, split_k, kv_used, mask_opt)
    (None, 1, 8, 2, 64, "causal", 1, 150, False),
    (None, 3, 4, 4, 64, "random", 2, None, False),      # one head a KV head: unpacked
    (Arch.AMD_GCN, 1, 16, 2, 128, "window", 3, 190, False),
    (Arch.AMD_GCN, 1, 16, 2, 256, "window", 3, 190, False),
    (Arch.NVIDIA, 4, 32, 8, 128, "random", 1, None, False),
    (Arch.NVIDIA, 9, 32, 8, 128, "window", 2, None, True),   # skipped blocks between live ones
]


@pytest.mark.parametrize("arch,n_q,n_head,n_head_kv,hs,kind,split_k,used,mask_opt", LOADS_FIRST_CASES)
def test_loads_first_bit_identical(device, arch, n_q, n_head, n_head_kv, hs, kind, split_k, used, mask_opt):
    """Decode-sized calls issuing a tile's mask, K and V loads first, or a tile ahead
    (tuning.fa_loads_first 1, 2), or the
    tile's K and V into shared memory a share a thread (3),
    give the result of loading them where they are used, bit for bit: masks with dead thread
    parts, live cells from a buffer, splits."""
    rng = np.random.default_rng(n_q * 10 + n_head)
    n_kv = 700 if mask_opt else 200
    q, k, v = make_qkv(rng, n_head=n_head, n_head_kv=n_head_kv, n_q=n_q, n_kv=n_kv, hsk=hs)
    if kind == "random":
        mask = random_mask(rng, n_q, n_kv)
    else:   # the engine's: the cells past the live ones masked
        live = used or n_kv
        mask = np.full((1, 1, n_q, n_kv), NEG_INF, np.float16)
        mask[..., :live] = causal_mask(n_q, live, window=(250 if mask_opt else 60) if kind == "window" else 0)
    t_used = tensor_from_numpy(device, np.array([used], np.int32)) if used else None
    base = tuning(device, arch)
    if hs == 256:   # a 16-cell K/V tile of head 256 as floats is past lavapipe's 32 KiB of shared memory
        base = dataclasses.replace(base, fa_decode_bc=8)
    try:
        got = {}
        for first in (0, 1, 2, 3):
            t = dataclasses.replace(base, fa_loads_first=first, fa_ahead_max_bytes=0)
            got[first], fa = flash(device, q, k, v, mask, tuning=t, split_k=split_k, kv_used=t_used, mask_opt=mask_opt)
            assert fa.decode_sized and fa.n_split == split_k and fa._attn.defines["LOADS_FIRST"] == first
            assert fa.mask_opt == mask_opt
        check(got[2], q, k, v, mask)
        assert np.array_equal(_bits(got[1]), _bits(got[0]))
        assert np.array_equal(_bits(got[2]), _bits(got[0]))
        assert np.array_equal(_bits(got[3]), _bits(got[0]))
    finally:
        if t_used is not None:
            t_used.close()


def test_gcn_prompt_tile_by_head(device):
    """The GCN table's prompts at head 256 take 512 invocations (fa_prompt_wg_by_head: 16 x 32
    tiles at 2 rows a thread), checked against the reference with a causal mask; its decode and
    head 128 and quantised caches keep fa_wg."""
    rng = np.random.default_rng(256)
    t = tuning(device, Arch.AMD_GCN)
    assert dict(t.fa_prompt_wg_by_head) == {256: 512} and t.fa_wg == 256
    for hs, n_q, wg in ((256, 40, 512), (256, 1, 256), (128, 40, 256)):
        n_kv = 96
        q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=n_q, n_kv=n_kv, hsk=hs)
        mask = causal_mask(n_q, n_kv)
        got, fa = flash(device, q, k, v, mask, tuning=t)
        assert fa.tile.wg == wg and fa.decode_sized == (n_q == 1)
        check(got, q, k, v, mask)


DOT_SCATTER_CASES = [
    # (tuning, n_q, head size, dot lanes, loads first, rows a thread at most): scores a thread 1
    # (decode, NVIDIA), 2, 4, 8, and 12 (3 rows: padded to 16)
    (Arch.NVIDIA, 1, 128, 8, 2, None),
    (Arch.AMD_GCN, 1, 256, 8, 2, None),
    (Arch.AMD_GCN, 5, 64, 4, 1, None),
    (Arch.AMD_GCN, 40, 128, 8, 0, None),
    (Arch.NVIDIA, 24, 64, 2, 0, None),
    (Arch.AMD_GCN, 20, 64, 8, 0, 3),
]


@pytest.mark.parametrize("arch,n_q,hs,ds,first,rows", DOT_SCATTER_CASES)
def test_dot_scatter_bit_identical(device, arch, n_q, hs, ds, first, rows):
    """tuning.fa_dot_scatter (a tile's scores summed over the dot lanes by a reduce-scatter and an
    all-gather) gives the butterfly's bits, whatever the scores a thread or the lanes."""
    rng = np.random.default_rng(n_q + hs + ds)
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=2, n_q=n_q, n_kv=300, hsk=hs)
    mask = causal_mask(n_q, 300, window=200)
    base = dataclasses.replace(tuning(device, arch), fa_d_split=ds, fa_loads_first=first, fa_ahead_max_bytes=0)
    if rows:
        base = dataclasses.replace(base, fa_max_rows=rows)
    if ds > device.profile.subgroup_min:
        pytest.skip(f"{ds} dot lanes need subgroups of {ds}")
    got = {}
    for on in (False, True):
        got[on], fa = flash(device, q, k, v, mask, tuning=dataclasses.replace(base, fa_dot_scatter=on))
        assert fa._attn.defines["SCATTER"] == on and fa._attn.defines["DS"] == ds
        assert fa._attn.defines["LOADS_FIRST"] == (first if fa.decode_sized else 0)
        assert not rows or fa.tile.br == rows * fa.tile.row_groups
    check(got[True], q, k, v, mask)
    assert np.array_equal(_bits(got[True]), _bits(got[False]))


@pytest.mark.parametrize("kv_dtype,bc,ahead,expect", [(np.float16, 8, 128, 3), (np.float16, 16, 0, 2),
                                                     (np.float16, 16, 128, 1), (np.float32, 16, 128, 1)])
def test_kv_tile_in_shared_memory_falls_back_where_it_does_not_fit(device, kv_dtype, bc, ahead, expect):
    """fa_loads_first=3 holds the K/V tile of head 256 in shared memory as floats: 8 cells (16.6
    KiB) fit beside the Q tile, 16 (33 KiB) do not (a 32 KiB device takes 2 then, and 1 where a
    thread's share of the tile is past fa_ahead_max_bytes); the same result either way."""
    if device.profile.shared_memory != 32768:
        pytest.skip("the sizes are chosen for 32 KiB of shared memory")
    rng = np.random.default_rng(8)
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=1, n_q=1, n_kv=100, hsk=256, kv_dtype=kv_dtype)
    mask = causal_mask(1, 100)
    t = dataclasses.replace(tuning(device, Arch.AMD_GCN), fa_loads_first=3, fa_decode_bc=bc, fa_ahead_max_bytes=ahead)
    got, fa = flash(device, q, k, v, mask, tuning=t, split_k=2)
    assert fa._attn.defines["LOADS_FIRST"] == expect
    check(got, q, k, v, mask)


@pytest.mark.parametrize("hs,kv_dtype,expect", [(64, np.float32, 2), (128, np.float16, 2), (128, np.float32, 1),
                                                 (256, np.float16, 1)])
def test_tile_ahead_within_its_bytes(device, hs, kv_dtype, expect):
    """The GCN table holds the next K/V tile (LOADS_FIRST 2) only where a thread's share of a tile
    is at most fa_ahead_max_bytes (128: 8 dot lanes, 2 cells a thread): past it one tile (1),
    with the same bits."""
    rng = np.random.default_rng(hs)
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=2, n_q=1, n_kv=100, hsk=hs, kv_dtype=kv_dtype)
    mask = causal_mask(1, 100)
    t = tuning(device, Arch.AMD_GCN)
    assert t.fa_ahead_max_bytes == 128 and t.fa_loads_first == 2
    got, fa = flash(device, q, k, v, mask, tuning=t, split_k=2)
    assert fa.tile.d_split == 8 and fa._attn.defines["LOADS_FIRST"] == expect
    ahead, fb = flash(device, q, k, v, mask, tuning=dataclasses.replace(t, fa_ahead_max_bytes=0), split_k=2)
    assert fb._attn.defines["LOADS_FIRST"] == 2
    check(got, q, k, v, mask)
    assert np.array_equal(_bits(got), _bits(ahead))


def test_gqa_pack_rule(device):
    """Packed by default for up to fa_pack_max_q queries when the shape allows; refused by name
    where it does not."""
    rng = np.random.default_rng(3)
    limit = device.tuning.fa_pack_max_q
    for n_q, n_head_kv, expect in ((1, 1, 4), (limit, 2, 2), (limit + 1, 1, 1), (1, 4, 1)):
        q, k, v = make_qkv(rng, n_head=4, n_head_kv=n_head_kv, n_q=n_q, n_kv=40)
        _, fa = flash(device, q, k, v, causal_mask(n_q, 40))
        assert fa.pack == expect, (n_q, n_head_kv)
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=1, n_q=1, n_kv=40)
    per_head = np.concatenate([random_mask(rng, 1, 40) for _ in range(4)], axis=1)
    got, fa = flash(device, q, k, v, per_head)
    assert fa.pack == 1
    check(got, q, k, v, per_head)
    with pytest.raises(UnsupportedShape, match="ALiBi"):
        flash(device, q, k, v, alibi_mask(1, 40), max_bias=8.0, gqa_pack=True)
    with pytest.raises(UnsupportedShape, match="plane per head"):
        flash(device, q, k, v, per_head, gqa_pack=True)


def test_pack_rows_by_head(device):
    """fa_pack_rows_by_head gives packed decode calls of that head size its rows a thread (one
    workgroup a KV head where they reach the packed heads), other heads fa_pack_rows, a type
    fa_pack_rows_by_type names its own; each against the reference, the same bits as one row."""
    base = tuning(device, Arch.NVIDIA)
    t = dataclasses.replace(base, fa_pack_rows=1, fa_pack_rows_by_head=((128, 2),), fa_pack_rows_by_type=())
    rng = np.random.default_rng(12)
    for hs, dtype, rows_type, rpt in ((128, np.float16, (), 2), (64, np.float16, (), 1),
                                      (128, np.float32, (("F32", 1),), 1)):
        q, k, v = make_qkv(rng, n_head=16, n_head_kv=2, n_q=1, n_kv=200, hsk=hs, kv_dtype=dtype)
        mask = causal_mask(1, 200)
        got, fa = flash(device, q, k, v, mask, tuning=dataclasses.replace(t, fa_pack_rows_by_type=rows_type))
        one, fb = flash(device, q, k, v, mask, tuning=dataclasses.replace(t, fa_pack_rows_by_head=()))
        assert fa.pack == 8 and fa.tile.br == fa.tile.row_groups * rpt, (hs, dtype)
        assert fb.tile.br == fb.tile.row_groups
        check(got, q, k, v, mask)
        assert np.array_equal(_bits(got), _bits(one))


@pytest.mark.parametrize("gqa", [4, 1])
def test_decode_tiles_take_fa_decode_bc(device, gqa):
    """Decode-sized calls (up to fa_pack_max_q queries), packed or not, take fa_decode_bc KV
    columns a tile; longer ones keep fa_bc; both against the reference, split or not."""
    t = dataclasses.replace(device.tuning, fa_bc=32, fa_decode_bc=8)
    rng = np.random.default_rng(gqa)
    for n_q, bc in ((1, 8), (t.fa_pack_max_q + 1, 32)):
        q, k, v = make_qkv(rng, n_head=4, n_head_kv=4 // gqa, n_q=n_q, n_kv=96, hsk=64)
        mask = causal_mask(n_q, 96)
        for split_k in (1, 3):
            got, fa = flash(device, q, k, v, mask, tuning=t, split_k=split_k)
            assert fa.tile.bc == bc and fa.n_kv_tiles == 96 // bc and fa.n_split == split_k
            check(got, q, k, v, mask)


@pytest.mark.parametrize("gqa", [1, 4])
def test_decode_tiles_take_fa_decode_cols(device, gqa):
    """Decode-sized calls spread a workgroup over fa_decode_cols column lanes (at most a tile's
    columns; the row groups are the rest of it), longer calls over fa_cols; both against the
    reference."""
    t = dataclasses.replace(device.tuning, fa_bc=32, fa_decode_bc=16, fa_cols=8, fa_decode_cols=32)
    rng = np.random.default_rng(40 + gqa)
    for n_q, cols in ((1, 16), (3, 16), (t.fa_pack_max_q + 1, 8)):
        q, k, v = make_qkv(rng, n_head=4, n_head_kv=4 // gqa, n_q=n_q, n_kv=96, hsk=64)
        mask = causal_mask(n_q, 96)
        got, fa = flash(device, q, k, v, mask, tuning=t)
        ds = fa.tile.d_split
        assert fa.tile.cols == cols and fa.tile.wg == max(1, t.fa_wg // (ds * cols)) * ds * cols
        check(got, q, k, v, mask)


@pytest.mark.parametrize("used,split_k", [(77, 1), (77, 3), (300, 2), (1, 1), (40, 8)])   # 40: 3 of 5 splits get no tile
def test_kv_used_limits_the_cells(device, used, split_k):
    """kv_used ends the attention at the live cells: with the padding masked the result is the
    same (bit for bit unsplit; split, the splits share the live tiles instead of all of them), and
    cells past it are not attended even where the mask would let them be."""
    rng = np.random.default_rng(used)
    n_q, n_kv = 2, 320
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=n_q, n_kv=n_kv, hsk=64)
    open_mask = np.zeros((1, 1, n_q, n_kv), np.float16)
    padded = open_mask.copy()
    padded[..., used:] = NEG_INF
    t_used = tensor_from_numpy(device, np.array([used], np.int32))
    try:
        limited, fa = flash(device, q, k, v, padded, kv_used=t_used, split_k=split_k)
        plain, _ = flash(device, q, k, v, padded, split_k=split_k)
        check(limited, q, k, v, padded)
        if fa.n_split == 1:
            assert np.array_equal(_bits(limited), _bits(plain))
        got, _ = flash(device, q, k, v, open_mask, kv_used=t_used, split_k=split_k)
        check(got, q[:, :, :, :], k[:, :, :used], v[:, :, :used], open_mask[..., :used])
        got_nomask, _ = flash(device, q, k, v, None, kv_used=t_used, split_k=split_k)
        check(got_nomask, q, k[:, :, :used], v[:, :, :used])
    finally:
        t_used.close()


@pytest.mark.parametrize("used,split_min,one_split", [(40, 4, True), (40, 1, False), (150, 4, False)])
def test_live_tiles_a_split(device, used, split_min, one_split):
    """A decode-sized call recorded with splits gives each split at least fa_decode_split_min_live
    of the live tiles: where that leaves one split, it writes the unsplit result bit for bit (no
    merge); else the splits merge to the reference, replayed twice (the done counts reset)."""
    rng = np.random.default_rng(used + split_min)
    n_q, n_kv = 1, 256
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=2, n_q=n_q, n_kv=n_kv, hsk=64)
    mask = np.zeros((1, 1, n_q, n_kv), np.float16)
    mask[..., used:] = NEG_INF
    t = dataclasses.replace(device.tuning, fa_decode_bc=16, fa_decode_split_min_live=split_min)
    t_used = tensor_from_numpy(device, np.array([used], np.int32))
    try:
        split, fa = flash(device, q, k, v, mask, tuning=t, split_k=8, kv_used=t_used)
        again, _ = flash(device, q, k, v, mask, tuning=t, split_k=8, kv_used=t_used)
        plain, fb = flash(device, q, k, v, mask, tuning=t, split_k=1, kv_used=t_used)
        assert fa.n_split == 8 and fb.n_split == 1 and fa.tile.bc == 16
        check(split, q, k, v, mask)
        assert np.array_equal(_bits(split), _bits(again))
        assert np.array_equal(_bits(split), _bits(plain)) == one_split
    finally:
        t_used.close()


MASK_ZERO_CASES = [
    # (tuning, n_q, n_head, n_head_kv, head size, loads first, split_k, mask_opt)
    (None, 1, 8, 2, 64, None, 1, False),
    (Arch.NVIDIA, 1, 32, 4, 128, 2, 3, False),
    (Arch.AMD_GCN, 2, 16, 2, 128, 3, 2, False),
    (Arch.AMD_GCN, 1, 16, 2, 64, 1, 1, True),
]


@pytest.mark.parametrize("arch,n_q,n_head,n_head_kv,hs,first,split_k,mask_opt", MASK_ZERO_CASES)
def test_mask_zero_flag_skips_the_mask(device, arch, n_q, n_head, n_head_kv, hs, first, split_k, mask_opt):
    """A step flagged mask-zero reads no mask: over a mask that is 0 on the live cells the result
    is the unflagged one bit for bit, and over one that hides live cells it is the attention
    without them hidden (the flag is the engine's promise); a flag of 0 reads the mask."""
    rng = np.random.default_rng(hs + n_q)
    used, n_kv = 190, 256
    q, k, v = make_qkv(rng, n_head=n_head, n_head_kv=n_head_kv, n_q=n_q, n_kv=n_kv, hsk=hs)
    zero = np.full((1, 1, n_q, n_kv), NEG_INF, np.float16)
    zero[..., :used] = 0
    hiding = zero.copy()
    hiding[..., 3:60] = NEG_INF
    t = tuning(device, arch)
    if first is not None:
        t = dataclasses.replace(t, fa_loads_first=first, fa_ahead_max_bytes=0)
    t_used = tensor_from_numpy(device, np.array([used], np.int32))
    flags = [tensor_from_numpy(device, np.array([f], np.int32)) for f in (0, 1)]
    try:
        run = dict(tuning=t, split_k=split_k, kv_used=t_used, mask_opt=mask_opt)
        plain, _ = flash(device, q, k, v, zero, **run)
        got, fa = flash(device, q, k, v, zero, mask_zero=flags[1], **run)
        assert fa._attn.defines.get("MASK_ZERO") == 1 and fa.n_split == split_k
        assert np.array_equal(_bits(got), _bits(plain))
        skipped, _ = flash(device, q, k, v, hiding, mask_zero=flags[1], **run)
        assert np.array_equal(_bits(skipped), _bits(plain))
        read, _ = flash(device, q, k, v, hiding, mask_zero=flags[0], **run)
        check(read, q, k, v, hiding)
        assert not np.array_equal(_bits(read), _bits(plain))
    finally:
        for x in (t_used, *flags):
            x.close()


def test_mask_zero_flag_only_where_it_applies(device):
    """Calls past decode size, without live cells or without a mask take no flag binding."""
    rng = np.random.default_rng(9)
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=40, n_kv=64, hsk=64)
    flag = tensor_from_numpy(device, np.array([1], np.int32))
    t_used = tensor_from_numpy(device, np.array([64], np.int32))
    mask = np.zeros((1, 1, 40, 64), np.float16)
    try:
        for args, kw in (((q, k, v, mask), dict(kv_used=t_used)), ((q[:, :, :1], k, v, mask[..., :1, :]), {}),
                         ((q[:, :, :1], k, v, None), dict(kv_used=t_used))):
            got, fa = flash(device, *args, mask_zero=flag, **kw)
            assert "MASK_ZERO" not in fa._attn.defines
            check(got, *args)
        bad = tensor_from_numpy(device, np.array([1.0], np.float32))
        try:
            with pytest.raises(UnsupportedShape, match="mask_zero must be one I32"):
                flash(device, q, k, v, mask, mask_zero=bad)
        finally:
            bad.close()
    finally:
        flag.close()
        t_used.close()


@pytest.mark.parametrize("on,limit,hs,takes", [(True, 128, 256, False), (True, 128, 128, True), (True, 0, 256, True),
                                               (False, 0, 64, False)])
def test_mask_zero_head_limit(device, on, limit, hs, takes):
    """tuning.fa_mask_zero_max_head: past it (or with fa_mask_zero off) the kernel has no mask-free
    loop and reads the mask whatever the flag says."""
    rng = np.random.default_rng(hs)
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=1, n_kv=64, hsk=hs)
    mask = np.zeros((1, 1, 1, 64), np.float16)
    mask[..., 5:9] = NEG_INF   # the flag promises otherwise: only a kernel that takes it ignores this
    t = dataclasses.replace(tuning(device, Arch.NVIDIA), fa_mask_zero=on, fa_mask_zero_max_head=limit, fa_decode_bc=8)
    flag = tensor_from_numpy(device, np.array([1], np.int32))
    t_used = tensor_from_numpy(device, np.array([64], np.int32))
    try:
        got, fa = flash(device, q, k, v, mask, tuning=t, kv_used=t_used, mask_zero=flag)
        assert (fa._attn.defines.get("MASK_ZERO") == 1) == takes
        check(got, q, k, v, np.zeros_like(mask) if takes else mask)
    finally:
        flag.close()
        t_used.close()


def test_kv_used_must_be_one_i32(device):
    rng = np.random.default_rng(4)
    q, k, v = make_qkv(rng, n_head=2, n_head_kv=1, n_q=1, n_kv=40)
    bad = tensor_from_numpy(device, np.array([3.0, 4.0], np.float32))
    try:
        with pytest.raises(UnsupportedShape, match="kv_used must be one I32"):
            flash(device, q, k, v, None, kv_used=bad)
    finally:
        bad.close()


# -- mask_opt --------------------------------------------------------------------------------------

def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


MASK_OPT_CASES = [
    # (tuning, n_q, n_kv, hsk, mask kind, split_k)
    (None, 64, 1024, 64, "causal", 1),
    (None, 64, 1024, 64, "padded", 1),
    (None, 64, 1100, 64, "window", 1),
    (None, 64, 1024, 64, "causal", 3),
    (None, 64, 1024, 64, "alibi", 1),
    (Arch.AMD_GCN, 64, 1024, 256, "causal", 1),
    (Arch.AMD_GCN, 40, 1500, 256, "window", 2),
]


@pytest.mark.parametrize("arch,n_q,n_kv,hsk,kind,split_k", MASK_OPT_CASES)
def test_mask_opt_bit_identical(device, arch, n_q, n_kv, hsk, kind, split_k):
    """Where the rule enables mask_opt, the output equals the output without it, bit for bit."""
    rng = np.random.default_rng(n_kv + hsk)
    q, k, v = make_qkv(rng, n_head=2, n_head_kv=1, n_q=n_q, n_kv=n_kv, hsk=hsk)
    max_bias = 0.0
    if kind == "alibi":
        mask, max_bias = alibi_mask(n_q, n_kv), 8.0
    elif kind == "padded":
        mask = causal_mask(n_q, n_kv, pad_to=n_q + 32)
    elif kind == "window":
        mask = causal_mask(n_q, n_kv, window=300)
    else:
        mask = causal_mask(n_q, n_kv)
    kw = dict(tuning=tuning(device, arch), split_k=split_k, max_bias=max_bias)
    on, fa_on = flash(device, q, k, v, mask, **kw)
    off, fa_off = flash(device, q, k, v, mask, mask_opt=False, **kw)
    assert fa_on.mask_opt and not fa_off.mask_opt  # the rule chose it
    check(on, q, k, v, mask, max_bias=max_bias)
    assert np.array_equal(_bits(on), _bits(off))


def _codes(mask2d, n_q, n_kv, br, bc):
    """numpy classification of the mask's Br x Bc blocks: 1 all -inf, 2 all zero, 0 mixed."""
    rows, tiles = -(-n_q // br), -(-n_kv // bc)
    codes = np.zeros((rows, tiles), np.uint32)
    for i in range(rows):
        for j in range(tiles):
            blk = mask2d[i * br:min(n_q, (i + 1) * br), j * bc:min(n_kv, (j + 1) * bc)]
            codes[i, j] = 1 if np.all(blk == -np.inf) else (2 if np.all(blk == 0) else 0)
    return codes


def _run_parts(device, fa, tensors_out, overwrite=None):
    """Run the pre-pass, optionally overwrite the block codes, then the attention."""
    with CommandSequence(device) as seq:
        with seq.record():
            fa.record_mask_opt(seq)
        seq.run()
        if overwrite is not None:
            upload(device, fa.mask_opt_blocks, np.full(fa.mask_opt_blocks.size // 4, overwrite, np.uint32))
        codes = download(device, fa.mask_opt_blocks, np.uint32)
        with seq.record():
            fa.record_attention(seq)
        seq.run()
    return codes, read_tensor(tensors_out)


def test_mask_opt_codes_and_their_use(device):
    """The pre-pass codes equal numpy's classification; the kernel skips blocks coded all -inf
    and skips the mask of blocks coded all zero (proved by overwriting the codes)."""
    rng = np.random.default_rng(2)
    n_q, n_kv = 40, 1000
    q, k, v = make_qkv(rng, n_head=2, n_head_kv=1, n_q=n_q, n_kv=n_kv)
    mask = causal_mask(n_q, n_kv, window=400)
    mask[0, 0, 3, 100] = 1.5  # one mixed block among all -inf ones
    ts = [tensor_from_numpy(device, a) for a in (q, k, v, mask)]
    out = Tensor.empty(device, F32, (64, 2, n_q, 1))
    try:
        with FlashWork(device) as work:
            fa = FlashAttn(device, *ts[:3], out, ts[3], scale=0.125, mask_opt=True, work=work, coopmat=False)
            br, bc = fa.tile.br, fa.tile.bc
            codes, got = _run_parts(device, fa, out)
            words = codes.reshape(fa.n_row_tiles, -1)
            unpacked = (words[:, :, None] >> (2 * np.arange(16, dtype=np.uint32))) & 3
            expect = _codes(mask[0, 0], n_q, n_kv, br, bc)
            assert np.array_equal(unpacked.reshape(fa.n_row_tiles, -1)[:, :expect.shape[1]], expect)
            assert {0, 1, 2} <= set(np.unique(expect))
            check(got, q, k, v, mask, scale=0.125)

            _, dead = _run_parts(device, fa, out, overwrite=0x55555555)  # every block all -inf
            assert (dead == 0).all()
            _, unmasked = _run_parts(device, fa, out, overwrite=0xAAAAAAAA)  # every block all zero
            check(unmasked, q, k, v, None, scale=0.125)
    finally:
        for t in (*ts, out):
            t.close()


def test_mask_opt_forced(device):
    rng = np.random.default_rng(4)
    q, k, v = make_qkv(rng, n_q=8, n_kv=40)
    mask = causal_mask(8, 40)
    ts = [tensor_from_numpy(device, a) for a in (q, k, v, mask)]
    out = Tensor.empty(device, F32, (64, 4, 8, 1))
    try:
        def decided(mask=ts[3], **kw):   # deciding needs no memory
            return FlashAttn(device, *ts[:3], out, mask, scale=0.1, coopmat=False, **kw).mask_opt
        assert not decided()  # too small for the rule
        assert decided(mask_opt=True) and not decided(mask_opt=False)
        assert not decided(None, mask_opt=True)  # nothing to classify without a mask
        fa = FlashAttn(device, *ts[:3], out, ts[3], scale=0.1, mask_opt=True, coopmat=False)
        with CommandSequence(device) as seq:
            with pytest.raises(UnsupportedShape, match="mask_opt needs buffers: pass a FlashWork"):
                with seq.record():
                    fa.record(seq)
    finally:
        for t in (*ts, out):
            t.close()


# -- errors ------------------------------------------------------------------------------------------

def test_unsupported_head_size_says_what_is_supported(device):
    q = Tensor.empty(device, F32, (260, 4, 2, 1))
    k = Tensor.empty(device, F16, (260, 8, 2, 1))
    out = Tensor.empty(device, F32, (260, 2, 4, 1))
    try:
        with pytest.raises(UnsupportedShape, match="head size 260.*multiples of 8 from 8 to 256"):
            FlashAttn(device, q, k, k, out, scale=1.0)
    finally:
        for t in (q, k, out):
            t.close()


def test_misaligned_kv_view_is_refused(device):
    q = Tensor.empty(device, F32, (64, 4, 2, 1))
    cache = Tensor.empty(device, F16, (64 * 9 + 1,))
    out = Tensor.empty(device, F32, (64, 2, 4, 1))
    try:
        k = cache.view((64, 9, 1, 1), nb=(2, 128, 128 * 9, 128 * 9), offset=2)  # starts at an odd element
        with pytest.raises(UnsupportedShape, match="multiples of 8 bytes"):
            FlashAttn(device, q, k, k, out, scale=1.0)
        bad_gqa = Tensor.empty(device, F16, (64, 9, 3, 1))
        with pytest.raises(UnsupportedShape, match="not a multiple of n_head_kv 3"):
            FlashAttn(device, q, bad_gqa, bad_gqa, out, scale=1.0)
        bad_gqa.close()
    finally:
        for t in (q, cache, out):
            t.close()


@pytest.mark.parametrize("n_q,n_kv,split_k,gqa_pack", [(20, 300, 1, False), (20, 300, 3, False), (1, 700, 1, True),
                                                       (1, 700, 4, True), (4, 129, 2, True)])
def test_sinks(device, n_q, n_kv, split_k, gqa_pack):
    """Attention sinks (gpt-oss: one value a query head in the softmax's denominator), unsplit
    and merged by the last split, heads unpacked and packed; sinks below and far above the
    scores (the row's max moves to the sink); a row that sees nothing stays 0. Dropping the
    sinks from the reference misses by far more than the tolerance."""
    rng = np.random.default_rng(n_q + n_kv + split_k)
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=n_q, n_kv=n_kv)
    mask = causal_mask(n_q, n_kv)
    if n_q > 2:
        mask[0, 0, 2] = NEG_INF
    sinks = np.array([-3.0, 0.5, 2.0, 40.0], np.float32)
    ts = tensor_from_numpy(device, sinks)
    try:
        got, fa = flash(device, q, k, v, mask, split_k=split_k, gqa_pack=gqa_pack, sinks=ts)
    finally:
        ts.close()
    assert fa.n_split == split_k and fa.pack == (2 if gqa_pack else 1)
    ref = check(got, q, k, v, mask, sinks=sinks)
    if n_q > 2:
        assert (got[:, 2] == 0).all()
    assert nmse(ref, attention_reference(q, k, v, mask, scale=q.shape[-1] ** -0.5)) > 1e-3


def test_sinks_are_checked(device):
    q, k, v = make_qkv(np.random.default_rng(0), n_head=4, n_head_kv=2, n_q=3, n_kv=64)
    bad = tensor_from_numpy(device, np.zeros(3, np.float32))
    try:
        with pytest.raises(UnsupportedShape, match="one a query head"):
            flash(device, q, k, v, sinks=bad)
    finally:
        bad.close()


def _rotated_apart(device, q, k, v, mask, n, **kw):
    """FlashAttn, then hadamard() over its output in runs of n: (out, the op)."""
    inputs = [tensor_from_numpy(device, a) for a in (q, k, v, mask)]
    out = Tensor.empty(device, F32, (v.shape[-1], q.shape[1], q.shape[2], q.shape[0]))
    try:
        with FlashWork(device) as work, CommandSequence(device) as seq:
            fa = FlashAttn(device, *inputs[:3], out, inputs[3], scale=q.shape[-1] ** -0.5, work=work,
                           coopmat=False, **kw)
            with seq.record():
                fa.record(seq)
                hadamard(seq, out, n)
            seq.run()
            return read_tensor(out), fa
    finally:
        for t in (*inputs, out):
            t.close()


@pytest.mark.parametrize("n_q,n_head,n_head_kv,hs,n,split_k", [(1, 8, 2, 64, 64, 1), (1, 8, 2, 128, 64, 3),
                                                               (1, 16, 2, 128, 128, 2), (20, 4, 2, 64, 32, 1),
                                                               (20, 4, 2, 128, 64, 2)])
def test_output_rotated_back_same_bits(device, n_q, n_head, n_head_kv, hs, n, split_k):
    """out_rot: the output rotated back in runs of n inside the kernel (a split row tile's merge,
    or the unsplit write; packed decode and prompt rows) has the bits of hadamard() after it."""
    rng = np.random.default_rng(hs + n + split_k)
    q, k, v = make_qkv(rng, n_head=n_head, n_head_kv=n_head_kv, n_q=n_q, n_kv=180, hsk=hs)
    mask = random_mask(rng, n_q, 180, masked=0.3)
    apart, fa = _rotated_apart(device, q, k, v, mask, n, split_k=split_k)
    got, fb = flash(device, q, k, v, mask, split_k=split_k, out_rot=n)
    assert fb.n_split == fa.n_split == split_k and fb._attn.defines["OUT_ROT"] == n
    assert np.array_equal(_bits(got), _bits(apart))
    plain, _ = flash(device, q, k, v, mask, split_k=split_k)
    assert not np.array_equal(_bits(plain), _bits(got))
    with pytest.raises(UnsupportedShape, match="runs of 48"):
        flash(device, q, k, v, mask, out_rot=48)
