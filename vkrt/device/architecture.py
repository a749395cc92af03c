"""GPU architecture detection (docs/ARCHITECTURE.md §2) and the names VKRT_ARCH accepts."""

from __future__ import annotations

import enum

from ..errors import ConfigError

VENDOR_AMD = 0x1002
VENDOR_NVIDIA = 0x10DE
VENDOR_INTEL = 0x8086
VENDOR_NAMES = {VENDOR_AMD: "AMD", VENDOR_NVIDIA: "NVIDIA", VENDOR_INTEL: "Intel", 0x10005: "Mesa", 0x13B5: "ARM",
                0x5143: "Qualcomm", 0x1010: "ImgTec", 0x106B: "Apple"}

DRIVER_ID_MESA_LLVMPIPE = 13
DEVICE_TYPE_CPU = 4


class Arch(str, enum.Enum):
    AMD_GCN = "AMD_GCN"
    AMD_RDNA1 = "AMD_RDNA1"
    AMD_RDNA2 = "AMD_RDNA2"
    AMD_RDNA3 = "AMD_RDNA3"
    NVIDIA = "NVIDIA"
    INTEL = "INTEL"
    LLVMPIPE = "LLVMPIPE"
    OTHER = "OTHER"


_OVERRIDE_NAMES = {
    "gcn": Arch.AMD_GCN, "amd_gcn": Arch.AMD_GCN, "polaris": Arch.AMD_GCN,
    "rdna1": Arch.AMD_RDNA1, "amd_rdna1": Arch.AMD_RDNA1,
    "rdna2": Arch.AMD_RDNA2, "amd_rdna2": Arch.AMD_RDNA2,
    "rdna3": Arch.AMD_RDNA3, "amd_rdna3": Arch.AMD_RDNA3,
    "nvidia": Arch.NVIDIA, "intel": Arch.INTEL,
    "llvmpipe": Arch.LLVMPIPE, "lavapipe": Arch.LLVMPIPE, "other": Arch.OTHER,
}


def parse_arch(name: str) -> Arch:
    """'gcn', 'rdna2', 'AMD_GCN', ... -> Arch; a clear error for anything else."""
    key = name.strip().lower()
    if key in _OVERRIDE_NAMES:
        return _OVERRIDE_NAMES[key]
    raise ConfigError(f"VKRT_ARCH={name!r} is not an architecture; expected one of: {', '.join(override_names())}")


def override_names() -> tuple[str, ...]:
    """The short architecture names VKRT_ARCH accepts (the AMD_* spellings are accepted too)."""
    return tuple(sorted(k for k in _OVERRIDE_NAMES if "_" not in k))


def detect_architecture(
    *,
    vendor_id: int,
    device_type: int,
    driver_id: int,
    subgroup_min: int,
    subgroup_max: int,
    extensions: frozenset[str] | set[str],
    wavefronts_per_simd: int | None = None,
    int_dot_mixed_accelerated: bool = False,
) -> Arch:
    """The architecture a device belongs to, from its reported properties alone."""
    if driver_id == DRIVER_ID_MESA_LLVMPIPE or device_type == DEVICE_TYPE_CPU:
        return Arch.LLVMPIPE
    if vendor_id == VENDOR_NVIDIA:
        return Arch.NVIDIA
    if vendor_id == VENDOR_INTEL:
        return Arch.INTEL
    if vendor_id == VENDOR_AMD and "VK_AMD_shader_core_properties" in extensions:
        if subgroup_min == 64 and subgroup_max == 64:
            return Arch.AMD_GCN
        if subgroup_min == 32 and subgroup_max == 64:
            if wavefronts_per_simd == 20:
                return Arch.AMD_RDNA1
            return Arch.AMD_RDNA3 if int_dot_mixed_accelerated else Arch.AMD_RDNA2
    return Arch.OTHER
