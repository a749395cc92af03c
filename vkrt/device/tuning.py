"""The one tuning table: architecture -> kernel parameters. No other file branches on architecture.

Each entry says why it differs from the default. Kernels read the resolved `Tuning` of their
device (`device.tuning`), never the architecture itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .architecture import Arch
from .profile import DeviceProfile


@dataclass(frozen=True)
class Tuning:
    arch: Arch
    # workgroup size of 1-D elementwise kernels (fill, add, copy, convert)
    wg_size: int = 256
    # subgroup size kernels are laid out for; the workgroup sizes below are multiples of it
    subgroup: int = 32
    # workgroup size of reductions (one workgroup reduces one row)
    reduce_wg: int = 256
    # use 16-bit float arithmetic where a kernel has such a variant (storage is separate)
    fp16_math: bool = True
    # tile edge of the shared-memory transpose
    transpose_tile: int = 32

    def resolved(self, profile: DeviceProfile) -> "Tuning":
        """The table entry limited by what the device can actually do."""
        wg = min(self.wg_size, profile.max_workgroup_invocations)
        return dataclasses.replace(
            self,
            wg_size=wg,
            reduce_wg=min(self.reduce_wg, profile.max_workgroup_invocations),
            fp16_math=self.fp16_math and profile.fp16_math,
        )


TABLE: dict[Arch, Tuning] = {
    # Polaris/GCN: wave64 (min = max = 64) so every workgroup is a multiple of 64; RADV reports
    # shaderFloat16 = 0 and the hardware has no packed fp16 math: all arithmetic in fp32.
    Arch.AMD_GCN: Tuning(Arch.AMD_GCN, wg_size=256, subgroup=64, reduce_wg=256, fp16_math=False),
    # RDNA runs wave32 natively but kernels stay correct at 64.
    Arch.AMD_RDNA1: Tuning(Arch.AMD_RDNA1, subgroup=32),
    Arch.AMD_RDNA2: Tuning(Arch.AMD_RDNA2, subgroup=32),
    Arch.AMD_RDNA3: Tuning(Arch.AMD_RDNA3, subgroup=32),
    Arch.NVIDIA: Tuning(Arch.NVIDIA, subgroup=32),
    Arch.INTEL: Tuning(Arch.INTEL, subgroup=16, wg_size=128, reduce_wg=128),
    # lavapipe: a CPU; subgroup 8 (AVX2 lanes), small workgroups keep its threads busy.
    Arch.LLVMPIPE: Tuning(Arch.LLVMPIPE, subgroup=8, wg_size=64, reduce_wg=64),
    Arch.OTHER: Tuning(Arch.OTHER, subgroup=32, wg_size=128, reduce_wg=128),
}


def tuning_for(profile: DeviceProfile) -> Tuning:
    return TABLE[profile.architecture].resolved(profile)
