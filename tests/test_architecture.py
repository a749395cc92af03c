"""Architecture detection from synthetic property sets, the VKRT_ARCH override, the tuning table."""

import dataclasses

import pytest

from vkrt.device.architecture import (DRIVER_ID_MESA_LLVMPIPE, VENDOR_AMD, VENDOR_INTEL, VENDOR_NVIDIA, Arch,
                                      detect_architecture, override_names, parse_arch)
from vkrt.device.tune import tuning_for
from vkrt.device.tuning import TABLE
from vkrt.errors import ConfigError
from vkrt.owned import live_objects
from vkrt.settings import BY_NAME, Settings

AMD_EXTS = frozenset({"VK_AMD_shader_core_properties", "VK_EXT_subgroup_size_control"})


def detect(**kw):
    base = dict(vendor_id=VENDOR_AMD, device_type=2, driver_id=3, subgroup_min=64, subgroup_max=64,
                extensions=AMD_EXTS)
    base.update(kw)
    return detect_architecture(**base)


def test_polaris_on_radv_is_gcn():
    assert detect() is Arch.AMD_GCN


def test_amd_without_shader_core_properties_is_other():
    assert detect(extensions=frozenset()) is Arch.OTHER


@pytest.mark.parametrize("wps, mixed, arch", [(20, False, Arch.AMD_RDNA1), (16, False, Arch.AMD_RDNA2),
                                              (16, True, Arch.AMD_RDNA3)])
def test_rdna_generations(wps, mixed, arch):
    assert detect(subgroup_min=32, subgroup_max=64, wavefronts_per_simd=wps, int_dot_mixed_accelerated=mixed) is arch


def test_nvidia_intel_lavapipe():
    assert detect(vendor_id=VENDOR_NVIDIA, subgroup_min=32, subgroup_max=32, extensions=frozenset()) is Arch.NVIDIA
    assert detect(vendor_id=VENDOR_INTEL, subgroup_min=8, subgroup_max=32, extensions=frozenset()) is Arch.INTEL
    assert detect(vendor_id=0x10005, device_type=4, driver_id=DRIVER_ID_MESA_LLVMPIPE, subgroup_min=8,
                  subgroup_max=8, extensions=frozenset()) is Arch.LLVMPIPE
    assert detect(vendor_id=0x13B5, subgroup_min=16, subgroup_max=16, extensions=frozenset()) is Arch.OTHER


def test_override():
    """VKRT_ARCH is kept as its text by the settings and parsed by the device layer."""
    assert parse_arch(Settings.from_env({"VKRT_ARCH": "gcn"}).arch) is Arch.AMD_GCN
    assert parse_arch(Settings.from_env({"VKRT_ARCH": " RDNA2 "}).arch) is Arch.AMD_RDNA2
    assert parse_arch("amd_gcn") is parse_arch("Polaris") is Arch.AMD_GCN
    assert Settings.from_env({}).arch == "" and Settings.from_env({"VKRT_ARCH": " "}).arch == ""
    with pytest.raises(ConfigError, match="VKRT_ARCH='vega' is not an architecture; expected one of: gcn"):
        parse_arch("vega")


def test_the_settings_table_lists_the_names_the_override_takes():
    """settings.py declares VKRT_ARCH's names (docs/environment.md's table) without importing the
    device layer: they must be the ones parse_arch takes."""
    assert BY_NAME["VKRT_ARCH"].choices == override_names()
    assert {parse_arch(name) for name in override_names()} == set(Arch)


def test_instance_refuses_a_bad_override_before_creating_anything():
    from vkrt.device import Device, Instance
    before = live_objects()
    bad = Settings.from_env({"VKRT_ARCH": "vega"})
    with pytest.raises(ConfigError, match="VKRT_ARCH='vega'.*gcn"):
        Instance(settings=bad)
    with pytest.raises(ConfigError, match="VKRT_ARCH='vega'.*gcn"):
        Device(settings=bad)
    assert live_objects() == before


def test_override_applies_to_the_opened_device(monkeypatch, device):
    monkeypatch.setenv("VKRT_ARCH", "gcn")
    from vkrt.device import Device
    with Device() as dev:
        assert dev.instance.arch_override is Arch.AMD_GCN and device.instance.arch_override is None
        assert dev.profile.architecture is Arch.AMD_GCN
        assert dev.profile.detected_architecture is device.profile.detected_architecture
        assert dev.tuning.arch is Arch.AMD_GCN
        assert dev.tuning.fp16_math is False
        assert dev.tuning.wg_size % 64 == 0


def test_every_architecture_has_a_tuning_entry():
    assert set(TABLE) == set(Arch)


def test_gcn_tuning_is_wave64_and_fp32(device):
    gcn = TABLE[Arch.AMD_GCN]
    assert gcn.subgroup == 64 and gcn.wg_size % 64 == 0 and gcn.reduce_wg % 64 == 0 and not gcn.fp16_math


def test_tuning_is_limited_by_the_device(device):
    small = dataclasses.replace(device.profile, architecture=Arch.NVIDIA, max_workgroup_invocations=128,
                                fp16_math=False)
    t = tuning_for(small)
    assert t.wg_size == 128 and t.fp16_math is False
