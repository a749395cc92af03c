"""norm_rope in flash attention's prologue (one token): the attention's output and both caches bit
for bit against norm_rope (queries riding in K's dispatch, V's store alongside) and the attention
apart, which have their own tests against rms_norm / rope / set_rows and a float64 reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from file_modules import ROOT, load
from test_flash_attn import tuning

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.device.architecture import Arch
from vkrt.device.tuning import TABLE
from vkrt.memory import F32, Tensor
from vkrt.ops.fa_norm_rope import fa_norm_rope
from vkrt.ops.kv_quant import kv_type
from vkrt.ops.flash_attn import FlashAttn
from vkrt.ops.flash_work import FlashWork
from vkrt.ops.norm_rope import norm_rope

N_CELLS = 80


def past_cache(device, rng, cache: str, shape: tuple) -> Tensor:
    """A cache (heads, cells, head size) of random values (bench/flash_attn_decode.py's: a
    quantised type's blocks random bytes under fp16 scales)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "bench"))   # its own imports: common, flash_attn
        return load("bench", "flash_attn_decode").cache(device, shape, kv_type(cache), rng)


def run(device, *, fused, hd=64, n_head=4, n_kv_head=2, cache="F16", norm=True, cell=37, n_kv=64, used=None,
        split_k=None, arch=None, rope=None, sections=None, gated=False, seed=0, loads_first=None, mask_opt=None,
        k_rot=0, v_rot=0, tiles=None, flag=None):
    """(attention output, K cache, V cache) after one token's norm_rope + attention, apart or
    with the prologue (fused); the caches start with the same random past. k_rot / v_rot: the
    cache stored Walsh-Hadamard rotated (the queries with K, the output rotated back). `tiles`:
    a list the attention's tile is appended to. `flag` (0 or 1): the step's mask-zero word, the
    mask then 0 on every live cell (one sequence's decode)."""
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((1, n_head, 2 * hd if gated else hd)) * 2).astype(np.float32)
    k = (rng.standard_normal((1, n_kv_head, hd)) * 2).astype(np.float32)
    v = rng.standard_normal((1, n_kv_head, hd)).astype(np.float32)
    live = used or n_kv
    mask = np.where(rng.random((1, n_kv)) < 0.2, -np.inf, 0).astype(np.float16)
    if flag is not None:
        mask[:] = 0
    mask[0, live:] = -np.inf
    mask[0, min(cell, n_kv - 1)] = 0
    pos = np.array([1234] if sections is None else [1234, 17, 99, 0], np.int32)
    own = [tensor_from_numpy(device, a) for a in (q, k, v)]
    own += [past_cache(device, rng, cache, (n_kv_head, N_CELLS, hd)) for _ in range(2)]
    own += [tensor_from_numpy(device, a) for a in (mask, pos, np.array([cell], np.int32),
                                                  rng.uniform(0.5, 1.5, hd).astype(np.float32),
                                                  rng.uniform(0.5, 1.5, hd).astype(np.float32),
                                                  np.array([live], np.int32))]
    tq, tk, tv, kc, vc, tm, tp, cells, qw, kw, t_used = own
    t_flag = None
    if flag is not None:
        t_flag = tensor_from_numpy(device, np.array([flag], np.int32))
        own.append(t_flag)
    if gated:   # qwen35's projection: each head's queries, then its gate
        tq = tq.view((hd, n_head, 1), nb=(4, 8 * hd, 8 * hd * n_head))
    qr = Tensor.empty(device, F32, (hd, n_head, 1))
    out = Tensor.empty(device, F32, (hd, n_head, 1, 1))
    own += [qr, out]
    args = {"n_dims": hd, "freq_base": 10000.0, "neox": True, **(rope or {})}
    if sections is not None:
        args.update(sections=sections, interleaved=True)
    weights = dict(q_weight=qw, k_weight=kw) if norm else dict(q_weight=None, k_weight=None)
    try:
        with FlashWork(device) as work, CommandSequence(device) as seq:
            tune = tuning(device, arch)
            if loads_first is not None:
                tune = dataclasses.replace(tune, fa_loads_first=loads_first)
            pro = (fa_norm_rope(device, tq, tk, tv, tp, cells, kc, vc, eps=1e-6, rope_args=args, k_rot=k_rot,
                                v_rot=v_rot, **weights)
                   if fused else None)
            assert pro is not None or not fused
            fa = FlashAttn(device, qr.permute(0, 2, 1, 3), kc.slice(1, 0, n_kv), vc.slice(1, 0, n_kv), out, tm,
                           scale=hd ** -0.5, work=work, kv_used=t_used, split_k=split_k, coopmat=False,
                           tuning=tune, prologue=pro, mask_opt=mask_opt, out_rot=v_rot, mask_zero=t_flag)
            assert mask_opt is None or fa.mask_opt == mask_opt
            why = fa.prologue_blocker(pro, kc, vc, 0.0) if pro else ""
            assert (fa.prologue is not None) == fused, why
            if tiles is not None:
                tiles.append(fa.tile)
            with seq.record():
                if not fused:
                    norm_rope(seq, tk, tp, kc, weight=weights["k_weight"], eps=1e-6, rows=cells, store_v=(tv, vc),
                              with_q=(tq, qr, weights["q_weight"]), k_rot=k_rot, v_rot=v_rot, **args)
                    seq.barrier()
                fa.record(seq)
            assert loads_first is None or fa._attn.defines["LOADS_FIRST"] == loads_first
            assert flag is None or fa._attn.defines.get("MASK_ZERO") == 1
            seq.run()
            return read_tensor(out), read_tensor(kc), read_tensor(vc)   # (a quantised cache's raw blocks)
    finally:
        for t in own:
            t.close()


def same_bits(device, **kw):
    apart, fused = run(device, fused=False, **kw), run(device, fused=True, **kw)
    assert np.isfinite(apart[0]).all() and np.abs(apart[0]).max() > 0
    for a, b in zip(apart, fused):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    return apart


@pytest.mark.parametrize("cache", ["F16", "F32"])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("arch", [None, Arch.NVIDIA, Arch.AMD_GCN])
def test_same_bits_as_norm_rope_then_attention(device, cache, norm, arch):
    apart = same_bits(device, cache=cache, norm=norm, arch=arch)
    before = run(device, fused=False, cache=cache, norm=norm, arch=arch, cell=38)
    assert not np.array_equal(apart[1], before[1])   # the new cell's K was stored


@pytest.mark.parametrize("cell,split_k", [(37, 3), (70, 2)])
def test_prologue_rows_a_thread(device, cell, split_k):
    """The GCN table's F16 head-128 decode takes 2 query rows a thread where it does norm_rope's
    work (tuning.fa_prologue_pack_rows_by_head) and 1 apart: the same bits either way."""
    tiles = []
    kw = dict(cache="F16", hd=128, n_head=8, n_kv_head=1, cell=cell, split_k=split_k, n_kv=64 if cell < 64 else 72,
              arch=Arch.AMD_GCN)
    apart, fused = run(device, fused=False, tiles=tiles, **kw), run(device, fused=True, tiles=tiles, **kw)
    assert [t.br // t.row_groups for t in tiles] == [1, 2]
    for a, b in zip(apart, fused):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("cell,used,split_k", [(37, None, 3), (0, None, 4), (63, None, 2), (40, 41, 4),
                                               (70, 50, 2), (5, 20, 1)])
def test_the_cells_split_stores_it(device, cell, used, split_k):
    """The new cell in the first, a middle or the last split, at the live cells' end, past them
    (stored, not attended: the last split stores it) and past the attention's cells."""
    same_bits(device, cell=cell, used=used, split_k=split_k, n_kv=64 if cell < 64 else 72, arch=Arch.NVIDIA)


@pytest.mark.parametrize("cache,cell,used,split_k", [("F16", 37, None, 3), ("F32", 63, None, 2), ("F16", 70, 50, 2)])
def test_kv_tile_in_shared_memory(device, cache, cell, used, split_k):
    """The K/V tile loaded once a workgroup into shared memory (fa_loads_first=3) with the
    prologue: the new cell read from the prologue's copy, the same bits."""
    same_bits(device, cache=cache, cell=cell, used=used, split_k=split_k, n_kv=64 if cell < 64 else 72,
              arch=Arch.AMD_GCN, loads_first=3)


@pytest.mark.parametrize("cache,hd,k_rot,v_rot,arch,split_k,loads_first", [
    ("Q8_0", 64, 64, 64, Arch.AMD_GCN, 3, None),    # the GCN table's quantised kernel: the tile in shared memory
    ("Q8_0", 128, 128, 128, Arch.NVIDIA, 2, None),  # the NVIDIA table's: segments held a tile ahead as the words loaded
    ("Q4_0", 64, 64, 64, Arch.NVIDIA, 3, 2),        # blocks starting 2 bytes into a word
    ("Q5_1", 64, 64, 0, Arch.NVIDIA, 2, 1),         # one tile held: each value chosen
    ("Q4_1", 64, 64, 0, None, 2, None),             # V unrotated
    ("Q5_0", 64, 32, 64, Arch.AMD_GCN, 1, None),    # runs shorter than the head
    ("F16", 64, 64, 0, None, 2, None),              # a rotated F16 K cache
])
def test_rotated_quantised_cache(device, cache, hd, k_rot, v_rot, arch, split_k, loads_first):
    """A quantised (or rotated) cache: the prologue rotates the queries and the new K and V,
    quantises them into the caches and reads them back as stored (a tile held as the words loaded
    takes the new cell's words from the prologue's copy): the same bits as norm_rope's quantised
    stores and the attention apart."""
    apart = same_bits(device, cache=cache, hd=hd, k_rot=k_rot, v_rot=v_rot, arch=arch, split_k=split_k,
                      loads_first=loads_first)
    plain = run(device, fused=False, cache=cache, hd=hd, arch=arch, split_k=split_k)
    if k_rot:
        assert not np.array_equal(apart[0], plain[0])   # the rotations took part


@pytest.mark.parametrize("cache,hd,arch,loads_first,rot", [
    ("F16", 128, Arch.NVIDIA, None, 0),      # the table's: a tile ahead, 2 rows a thread
    ("Q8_0", 64, Arch.AMD_GCN, None, 64),    # the quantised tile in shared memory
    ("Q8_0", 128, Arch.NVIDIA, None, 128),   # segments held as the words loaded
    ("F32", 64, None, 1, 0),                 # one tile held: each value chosen
])
def test_mask_zero_loop_with_the_prologue(device, cache, hd, arch, loads_first, rot):
    """A step flagged mask-zero runs the KV loop without the mask, the new cell patched in there
    too: the same bits as the unflagged fused step and as norm_rope and the attention apart."""
    kw = dict(cache=cache, hd=hd, arch=arch, loads_first=loads_first, k_rot=rot, v_rot=rot, split_k=2, cell=40)
    apart = run(device, fused=False, flag=0, **kw)
    for flag in (0, 1):
        fused = run(device, fused=True, flag=flag, **kw)
        for a, b in zip(apart, fused):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_with_mask_opt(device):
    """mask_opt forced on (VKRT_FA_MASK_OPT=1) with the prologue: its pre-pass reads the mask's
    fields, which the prologue's push block leaves out; the same bits."""
    same_bits(device, split_k=2, mask_opt=True, arch=Arch.AMD_GCN)


@pytest.mark.parametrize("n_head,n_kv_head", [(8, 1), (3, 3), (8, 2)])
def test_head_groupings(device, n_head, n_kv_head):
    same_bits(device, n_head=n_head, n_kv_head=n_kv_head, split_k=2)


def test_unpacked_query_groups_stay_with_norm_rope(device):
    """Where a KV head's query heads are not one workgroup's (3 heads a group, no tile packs
    them), each would need the new K its group's first head stores: the attention says so and
    takes no prologue."""
    with pytest.raises(AssertionError, match="query heads are not one workgroup's"):
        run(device, fused=True, n_head=6, n_kv_head=2)


def test_partial_rotation_yarn_and_sections(device):
    same_bits(device, rope=dict(n_dims=32), hd=64)
    same_bits(device, rope=dict(freq_scale=1 / 32, ext_factor=1.0, n_ctx_orig=4096, attn_factor=1.5), hd=64)
    same_bits(device, sections=(11, 11, 10, 0), hd=64)


def test_head_size_128(device):
    same_bits(device, hd=128, n_head=4, n_kv_head=1, split_k=2)


def test_qwen35_attention(device):
    """Qwen3.5's gated attention: head 256, queries strided between their gates, IMROPE over a
    quarter of the head (sections 11, 11, 10), 16 query heads a KV head."""
    same_bits(device, hd=256, n_head=16, n_kv_head=1, gated=True, rope={"n_dims": 64}, sections=(11, 11, 10, 0),
              split_k=2)


@pytest.mark.parametrize("hd,limit,takes", [(256, 128, False), (128, 128, True), (256, 0, True)])
def test_prologue_head_limit(device, hd, limit, takes):
    """tuning.fa_prologue_max_head: past it the attention refuses the prologue, saying why (the
    NVIDIA table keeps norm_rope apart at head 256); 0: any head."""
    tune = dataclasses.replace(tuning(device, Arch.NVIDIA), fa_prologue_max_head=limit)
    q, k, v = (Tensor.empty(device, F32, (hd, h, 1)) for h in (8, 1, 1))
    kc, vc = (Tensor.empty(device, kv_type("F16"), (hd, 64, 1)) for _ in range(2))
    qr, out = Tensor.empty(device, F32, (hd, 8, 1)), Tensor.empty(device, F32, (hd, 8, 1, 1))
    mask = Tensor.empty(device, "F16", (64, 1))
    pos, cells = (tensor_from_numpy(device, np.array([3], np.int32)) for _ in range(2))
    own = [q, k, v, kc, vc, qr, out, mask, pos, cells]
    try:
        with FlashWork(device) as work:
            pro = fa_norm_rope(device, q, k, v, pos, cells, kc, vc, q_weight=None, k_weight=None, eps=1e-6,
                               rope_args={"n_dims": hd, "freq_base": 10000.0, "neox": True})
            assert pro is not None
            fa = FlashAttn(device, qr.permute(0, 2, 1, 3), kc, vc, out, mask, scale=hd ** -0.5, work=work,
                           coopmat=False, tuning=tune, prologue=pro)
            why = fa.prologue_blocker(pro, kc, vc, 0.0)
            assert (fa.prologue is not None) == takes, why
            assert takes or "fa_prologue_max_head (128)" in why
    finally:
        for t in own:
            t.close()
    assert TABLE[Arch.NVIDIA].fa_prologue_max_head == 128


def test_iq4_nl_stays_with_norm_rope(device):
    """IQ4_NL's quantiser would cost the attention its waves on GCN: norm_rope stores it."""
    t = [Tensor.empty(device, F32, s) for s in ((64, 4, 1), (64, 2, 1), (64, 2, 1))]
    caches = [Tensor.empty(device, kv_type(n), (64, 80, 2)) for n in ("IQ4_NL", "Q8_0")]
    pos = tensor_from_numpy(device, np.array([3], np.int32))
    try:
        args = dict(n_dims=64, freq_base=1e4)
        iq, q8 = caches
        assert fa_norm_rope(device, *t, pos, pos, iq, iq, rope_args=args, k_rot=64, v_rot=64) is None
        assert fa_norm_rope(device, *t, pos, pos, q8, q8, rope_args=args, k_rot=64, v_rot=64) is not None
        assert fa_norm_rope(device, *t, pos, pos, q8, q8, rope_args=args, k_rot=48) is None   # runs past the head
    finally:
        for x in (*t, *caches, pos):
            x.close()


def test_what_the_prologue_refuses(device):
    """More than one token, and an attention temperature, stay with norm_rope."""
    t = [Tensor.empty(device, F32, s) for s in ((64, 4, 2), (64, 2, 2), (64, 2, 2), (64, 80, 2), (64, 80, 2))]
    pos = tensor_from_numpy(device, np.array([3, 4], np.int32))
    try:
        q, k, v, kc, vc = t
        assert fa_norm_rope(device, q, k, v, pos, pos, kc, vc, rope_args=dict(n_dims=64, freq_base=1e4)) is None
        q1, k1, v1 = (x.slice(2, 0, 1) for x in (q, k, v))
        args = dict(n_dims=64, freq_base=1e4, attn_temp=(0.1, 8))
        assert fa_norm_rope(device, q1, k1, v1, pos, pos, kc, vc, rope_args=args) is None
        args.pop("attn_temp")
        assert fa_norm_rope(device, q1, k1, v1, pos, pos, kc, vc, rope_args=args) is not None
    finally:
        for x in (*t, pos):
            x.close()
