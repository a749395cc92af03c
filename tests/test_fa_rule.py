"""The flash-attention choices in the tuning table: the mask_opt rule, tiles, split-K (no kernels run)."""

import dataclasses

import pytest

from vkrt.device import Device
from vkrt.device.architecture import Arch
from vkrt.device.tune import tuning_for
from vkrt.device.tuning import fa_mask_opt_rule
from vkrt.errors import UnsupportedShape
from vkrt.ops.flash_attn import fa_tile, split_plan


def tuning_of(device, arch):
    return tuning_for(dataclasses.replace(device.profile, architecture=arch))


# a 2048-token ubatch over a 16k context: the shape the fork measured
BIG = dict(has_mask=True, nem0=16384, nem1=2048, bc=32)


@pytest.mark.parametrize("arch", [Arch.AMD_GCN, Arch.NVIDIA, Arch.LLVMPIPE, Arch.AMD_RDNA2, Arch.INTEL])
@pytest.mark.parametrize("hs", [64, 128, 256])
def test_other_architectures_follow_the_shape_rule(device, arch, hs):
    t = tuning_of(device, arch)
    assert fa_mask_opt_rule(t, hsk=hs, hsv=hs, **BIG)
    assert fa_mask_opt_rule(t, has_mask=True, nem0=512, nem1=65, hsk=hs, hsv=hs, bc=32)


@pytest.mark.parametrize("arch", [Arch.AMD_GCN, Arch.NVIDIA, Arch.LLVMPIPE])
@pytest.mark.parametrize("shape", [
    dict(has_mask=False, nem0=16384, nem1=2048, bc=32),   # no mask
    dict(has_mask=True, nem0=16384, nem1=31, bc=32),      # fewer than 32 rows
    dict(has_mask=True, nem0=1024, nem1=32, bc=32),       # 32768 elements, not more
    dict(has_mask=True, nem0=511, nem1=2048, bc=32),      # fewer than 16 KV tiles
    dict(has_mask=True, nem0=1023, nem1=2048, bc=64),
])
def test_small_shapes_are_off(device, arch, shape):
    assert not fa_mask_opt_rule(tuning_of(device, arch), hsk=256, hsv=256, **shape)


def test_vkrt_arch_gcn_gives_the_gcn_rule(monkeypatch):
    monkeypatch.setenv("VKRT_ARCH", "gcn")
    with Device() as dev:
        assert dev.profile.architecture == Arch.AMD_GCN
        assert dev.tuning.fa_wg == 256 and not dev.tuning.fp16_math


@pytest.mark.parametrize("hsk,hsv", [(64, 64), (80, 80), (72, 72), (128, 128), (192, 128), (256, 256), (8, 8)])
def test_gcn_tiles_are_wave64_and_fit(device, hsk, hsv):
    t = tuning_of(device, Arch.AMD_GCN)
    tile = fa_tile(t, hsk, hsv, 2048, 32 << 10)  # AMDVLK's 32 KiB
    assert tile.wg % 64 == 0 and tile.wg <= 256
    assert (hsk // 4) % tile.d_split == 0 and (hsv // 4) % tile.d_split == 0
    assert tile.bc % tile.cols == 0 and tile.br % tile.row_groups == 0
    assert tile.shared_bytes(hsk, hsv) <= 32 << 10
    assert (tile.br // tile.row_groups) * hsv // tile.d_split <= t.fa_o_regs or tile.br == tile.row_groups


def test_tile_shrinks_to_the_shared_memory(device):
    t = dataclasses.replace(tuning_of(device, Arch.LLVMPIPE), fa_o_regs=4096)
    roomy = fa_tile(t, 256, 256, 4096, 64 << 10)
    tight = fa_tile(t, 256, 256, 4096, 12 << 10)
    assert tight.br < roomy.br and tight.shared_bytes(256, 256) <= 12 << 10


def test_tile_no_taller_than_the_queries(device):
    t = tuning_of(device, Arch.NVIDIA)
    assert fa_tile(t, 128, 128, 1, 48 << 10).br == fa_tile(t, 128, 128, 1, 48 << 10).row_groups


def test_split_plan(device):
    t = tuning_of(device, Arch.AMD_GCN)
    assert split_plan(t, 4096, 512, None, 65535) == (1, 512)          # prefill fills the card
    n, per = split_plan(t, 8, 512, None, 65535)                        # decode: 8 workgroups
    assert n == 9 and per * n >= 512 and per * (n - 1) < 512
    assert split_plan(t, 8, 6, None, 65535) == (1, 6)                  # too few tiles to share
    assert split_plan(t, 8, 512, 1, 65535) == (1, 512)
    assert split_plan(t, 8, 10, 4, 65535) == (4, 3)
    assert split_plan(t, 8, 10, 6, 65535) == (5, 2)                    # no empty split
    assert split_plan(t, 8, 512, 100, 7) == (7, 74)
    with pytest.raises(UnsupportedShape):
        split_plan(t, 8, 512, 0, 65535)
    # decode-sized calls split down to fa_decode_split_min_tiles tiles a split
    assert split_plan(t, 8, 6, None, 65535, decode=True) == (3, 2)
    assert split_plan(t, 4, 32, None, 65535, decode=True) == (16, 2)


def test_packed_decode_tile(device):
    """Packed decode: Br and the packed heads divide one another, fa_pack_rows rows a thread."""
    for arch in (Arch.AMD_GCN, Arch.NVIDIA, Arch.LLVMPIPE):
        t = tuning_of(device, arch)
        for hs, gqa in ((128, 8), (256, 8), (128, 4), (64, 2)):
            tile = fa_tile(t, hs, hs, gqa, 48 << 10, pack=gqa, max_rows=t.fa_pack_rows)
            assert tile.br % gqa == 0 or gqa % tile.br == 0
            assert tile.br // tile.row_groups <= t.fa_pack_rows
    assert fa_tile(tuning_of(device, Arch.AMD_GCN), 128, 128, 7, 48 << 10, pack=7) is None


def test_gcn_prefill_tile_keeps_two_rows_a_thread(device):
    """More rows a thread cost ACO 208 VGPRs at head 128 (1 wave per SIMD); 2 rows take 84."""
    t = tuning_of(device, Arch.AMD_GCN)
    for hs in (64, 128, 256):
        tile = fa_tile(t, hs, hs, 2048, 64 << 10)
        assert tile.br // tile.row_groups <= 2
    other = fa_tile(tuning_of(device, Arch.NVIDIA), 128, 128, 2048, 48 << 10)
    assert other.br // other.row_groups == 4


def test_fill_follows_the_compute_units(device):
    """Where the driver reports compute units the split fill scales with them: an RX 580's 36
    CUs give the table's 72, an H200's 132 SMs under the GCN table 264; unknown keeps the table."""
    for units, arch, fill in ((36, Arch.AMD_GCN, 72), (132, Arch.AMD_GCN, 264), (132, Arch.NVIDIA, 528),
                              (None, Arch.AMD_GCN, 72), (None, Arch.NVIDIA, 512)):
        profile = dataclasses.replace(device.profile, architecture=arch, compute_units=units)
        assert tuning_for(profile).fa_fill_groups == fill
