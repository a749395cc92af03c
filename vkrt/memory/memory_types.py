"""Choosing a memory type for each kind of buffer."""

from __future__ import annotations

import enum

from ..device.profile import DeviceProfile, MemoryType


class MemoryKind(str, enum.Enum):
    DEVICE = "device"      # VRAM: weights, activations, KV cache
    HOST = "host"          # host-visible, written by the CPU (staging, uniforms)
    READBACK = "readback"  # host-visible and cached, read by the CPU


def memory_type_candidates(profile: DeviceProfile, type_bits: int, kind: MemoryKind) -> list[MemoryType]:
    """Allowed memory types for `kind`, best first. Empty when none qualifies."""
    allowed = [t for t in profile.memory_types if type_bits & (1 << t.index)]
    if kind is MemoryKind.DEVICE:
        local = [t for t in allowed if t.device_local]
        # pure VRAM first; host-visible VRAM (ReBAR, UMA, lavapipe) after; anything as last resort
        ordered = sorted(local, key=lambda t: t.host_visible) or allowed
    elif kind is MemoryKind.HOST:
        ordered = sorted((t for t in allowed if t.host_visible and t.host_coherent),
                         key=lambda t: (t.device_local, t.host_cached))
    else:
        ordered = sorted((t for t in allowed if t.host_visible),
                         key=lambda t: (not t.host_cached, not t.host_coherent, t.device_local))
    return list(ordered)
