"""Flash attention on cooperative matrices (shaders/flash_attn_cm.comp): against the float64
reference within fp16 operands' error, beside the scalar kernel on the same inputs; mask_opt on
and off bit for bit; where it runs and what it refuses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attn_reference import NEG_INF, alibi_mask, attention_reference, causal_mask, make_qkv, nmse, random_mask
from test_flash_attn import TOL, flash

from vkrt.commands import tensor_from_numpy
from vkrt.errors import UnsupportedShape
from vkrt.ops.flash_attn import fa_cm_defines, fa_cm_shared_bytes, fa_cm_tile

CM_TOL = 2e-5   # NMSE with Q, K, V and the probabilities in fp16 (sums in fp32)


def needs_coopmat(device):
    if not device.tuning.fa_coopmat:
        pytest.skip(f"{device.profile.name}: its tuning runs no flash attention on cooperative matrices "
                    "(VK_KHR_cooperative_matrix with 16x16x16 fp16 products)")


def both(device, q, k, v, mask=None, **kw):
    """(coopmat output, the op, scalar output) on the same inputs."""
    got, fa = flash(device, q, k, v, mask, coopmat=True, **kw)
    plain, _ = flash(device, q, k, v, mask, coopmat=False, **kw)
    return got, fa, plain


def check_both(got, plain, q, k, v, mask=None, **kw):
    ref = attention_reference(q, k, v, mask, scale=kw.pop("scale", q.shape[-1] ** -0.5), **kw)
    assert np.isfinite(got).all()
    assert nmse(plain, ref) < TOL
    err = nmse(got, ref)
    assert 0 < err < CM_TOL, f"NMSE {err:.3g}"
    return ref


@pytest.mark.gpu
@pytest.mark.parametrize("hsk,hsv,gqa", [(64, 64, 1), (128, 128, 4), (256, 256, 2), (192, 128, 1), (80, 80, 2)])
def test_head_sizes_and_groups(device, hsk, hsv, gqa):
    """Partial query tiles (70 rows) and KV tiles (150 cells) under a causal mask."""
    needs_coopmat(device)
    rng = np.random.default_rng(hsk + hsv + gqa)
    q, k, v = make_qkv(rng, n_head=2 * gqa, n_head_kv=2, n_q=70, n_kv=150, hsk=hsk, hsv=hsv)
    mask = causal_mask(70, 150)
    got, fa, plain = both(device, q, k, v, mask)
    assert fa.coopmat and fa.n_split == 1 and fa.tile.br % 16 == 0
    check_both(got, plain, q, k, v, mask)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["none", "padded_dead_rows", "random", "f32_kv", "softcap_alibi", "batch"])
def test_masks_types_and_options(device, kind):
    needs_coopmat(device)
    rng = np.random.default_rng(len(kind))
    n_q, n_kv, kw = 40, 100, {}
    q, k, v = make_qkv(rng, batch=2 if kind == "batch" else 1, n_q=n_q, n_kv=n_kv, hsk=128,
                       kv_dtype=np.float32 if kind == "f32_kv" else np.float16)
    mask = causal_mask(n_q, n_kv)
    if kind == "none":
        mask = None
    elif kind == "padded_dead_rows":
        mask = random_mask(rng, n_q, n_kv, masked=0.0, dead_rows=(0, 7, 39))
        mask[..., 90:] = NEG_INF
    elif kind == "random":
        mask = random_mask(rng, n_q, n_kv, masked=0.5)
    elif kind == "softcap_alibi":
        q *= 4
        mask = alibi_mask(n_q, n_kv)
        kw = dict(softcap=20.0, max_bias=4.0, scale=0.3)
    got, _, plain = both(device, q, k, v, mask, **kw)
    check_both(got, plain, q, k, v, mask, **kw)
    if kind == "padded_dead_rows":
        assert (got[:, [0, 7, 39]] == 0).all()


@pytest.mark.gpu
def test_sinks_and_kv_used(device):
    """Sinks join each row's denominator; kv_used stops at the live cells (the rest masked)."""
    needs_coopmat(device)
    rng = np.random.default_rng(11)
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=48, n_kv=128)
    mask = causal_mask(48, 128)
    mask[..., 100:] = NEG_INF
    sinks = np.array([-3.0, 0.5, 2.0, 40.0], np.float32)
    ts, used = tensor_from_numpy(device, sinks), tensor_from_numpy(device, np.array([100], np.int32))
    try:
        got, _, plain = both(device, q, k, v, mask, sinks=ts, kv_used=used)
    finally:
        ts.close()
        used.close()
    check_both(got, plain, q, k, v, mask, sinks=sinks)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["causal", "window"])
def test_mask_opt_is_bit_identical(device, kind):
    """Skipping all -inf blocks and the mask reads of all-zero ones changes no bit."""
    needs_coopmat(device)
    rng = np.random.default_rng(5)
    q, k, v = make_qkv(rng, n_q=130, n_kv=300, hsk=128)
    mask = causal_mask(130, 300, window=64 if kind == "window" else 0)
    on, fa, _ = both(device, q, k, v, mask, mask_opt=True)
    off, _ = flash(device, q, k, v, mask, coopmat=True, mask_opt=False)
    assert fa.mask_opt
    np.testing.assert_array_equal(on.view(np.uint32), off.view(np.uint32))


def test_where_it_runs(device):
    """Not for decode-sized calls (packed heads, fewer than fa_cm_min_q queries) nor by itself
    for heads past fa_cm_max_head, never split; refused by name when forced where it cannot run."""
    t = dataclasses.replace(device.tuning, fa_coopmat=True, fa_cm_min_q=32)
    rng = np.random.default_rng(1)
    few = make_qkv(rng, n_q=8, n_kv=64)
    _, fa = flash(device, *few, tuning=t, coopmat=None)
    assert not fa.coopmat and fa.pack == 2
    wide = make_qkv(rng, n_q=40, n_kv=64, hsk=256)   # past fa_cm_max_head: the scalar kernel unless forced
    _, fa = flash(device, *wide, tuning=dataclasses.replace(t, fa_cm_max_head=128), coopmat=None)
    assert not fa.coopmat and fa.pack == 1
    odd, many = make_qkv(rng, n_q=40, n_kv=64, hsk=72), make_qkv(rng, n_q=40, n_kv=64)
    for qkv, kw, why in ((few, {}, "heads of a KV head are packed"),
                         (odd, {}, "72/72 are not multiples of 16"),
                         (many, dict(tuning=dataclasses.replace(t, fa_coopmat=False)), "the tuning runs no"),
                         (many, dict(split_k=3), "does not split")):
        with pytest.raises(UnsupportedShape, match=why):
            flash(device, *qkv, **{"tuning": t, "coopmat": True, **kw})


def test_tile_fits_the_shared_memory():
    """4 subgroups of 16 rows where they fit, else 2; KV tiles of 64, 32 or 16 cells."""
    assert [fa_cm_tile(128, 128, 49152, 32).br, fa_cm_tile(128, 128, 49152, 32).bc] == [64, 32]
    assert [fa_cm_tile(256, 256, 49152, 32).br, fa_cm_tile(256, 256, 49152, 32).bc] == [32, 32]
    assert fa_cm_tile(128, 128, 49152, 32).wg == 128
    assert fa_cm_tile(576, 512, 16384, 32) is None
    assert fa_cm_shared_bytes(128, 128, 32, 4) == 35840


@pytest.mark.parametrize("extra", [{}, {"HAS_MASK": 1, "KV_USED": 1, "SINKS": 1}, {"K_F16": 0, "V_F16": 0}])
def test_compiles(extra):
    """Every variant compiles (lavapipe cannot run it), at the shared memory the tile takes."""
    from vkrt.pipeline.compiler import compile_shader
    from vkrt.pipeline.spirv import reflect
    for hsk, hsv in ((128, 128), (256, 256), (192, 128)):
        tile = fa_cm_tile(hsk, hsv, 49152, 32)
        options = {**dict(K_F16=1, V_F16=1, HAS_MASK=0, KV_USED=0, SINKS=0), **extra}
        spirv = compile_shader("flash_attn_cm", fa_cm_defines(hsk, hsv, tile, **options))
        assert reflect(spirv).shared_bytes == fa_cm_shared_bytes(hsk, hsv, tile.bc, tile.row_groups)
