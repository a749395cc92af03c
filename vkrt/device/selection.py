"""Which physical device to use: VKRT_DEVICE (index or name substring), else the best type."""

from __future__ import annotations

from ..errors import DeviceNotFound, UnsupportedDevice, VulkanUnavailable
from .profile import DeviceProfile
from .vk import INSTALL_HINT

TYPE_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}


def check_supported(profile: DeviceProfile) -> None:
    if profile.api < (1, 2):
        raise UnsupportedDevice(f"device {profile.index} ({profile.name}) supports Vulkan {profile.api_version}; "
                                "vkrt needs Vulkan 1.2")
    if not profile.timeline_semaphores:
        raise UnsupportedDevice(f"device {profile.index} ({profile.name}) has no timeline semaphores; vkrt needs them")
    if profile.compute_family is None:
        raise UnsupportedDevice(f"device {profile.index} ({profile.name}) has no compute queue")


def select_device(profiles: list[DeviceProfile], spec: str | None = None, what: str = "VKRT_DEVICE") -> DeviceProfile:
    """The profile to open. `spec` (settings.device, VKRT_DEVICE) is an index or a name substring;
    empty or None: the best type; `what` names where it came from in errors."""
    if not profiles:
        raise VulkanUnavailable(f"the Vulkan loader found no devices; {INSTALL_HINT}")
    spec = (spec or "").strip()
    listing = "; ".join(f"{p.index}: {p.name}" for p in profiles)
    if spec:
        if spec.isdigit():
            index = int(spec)
            if index >= len(profiles):
                raise DeviceNotFound(f"{what}={spec}: there are {len(profiles)} devices ({listing})")
            chosen = profiles[index]
        else:
            matches = [p for p in profiles if spec.lower() in p.name.lower()]
            if not matches:
                raise DeviceNotFound(f"{what}={spec!r} matches no device name ({listing})")
            chosen = matches[0]
        check_supported(chosen)
        return chosen
    usable = []
    for p in profiles:
        try:
            check_supported(p)
            usable.append(p)
        except UnsupportedDevice:
            continue
    if not usable:
        raise UnsupportedDevice(f"no device supports Vulkan 1.2 with timeline semaphores and compute ({listing})")
    return min(usable, key=lambda p: (TYPE_RANK.get(p.device_type, 5), p.index))
