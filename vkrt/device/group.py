"""DeviceGroup: the devices of `--device LIST`, opened on one instance and closed together. A
repeated index opens several logical devices on one physical GPU."""

from __future__ import annotations

from ..errors import ConfigError
from ..owned import Owned
from .device import Device
from .instance import Instance
from .selection import select_device


def parse_device_list(spec: str | None) -> list[str] | None:
    """`--device 0,1,2` / `--device "RX 580,1"` as a list of specs (None: not given)."""
    if spec is None:
        return None
    items = [s.strip() for s in str(spec).split(",")]
    if not items or any(not s for s in items):
        raise ConfigError(f"--device {spec!r}: give device indices or name substrings, comma-separated (e.g. 0,1)")
    return items


class DeviceGroup(Owned):
    """`devices[k]` is the device the k-th entry of `specs` names (index or name substring);
    without specs, the one device vkrt picks alone (VKRT_DEVICE, else the best). Device k is
    labelled Vulkan{k}, as llama.cpp names its devices. `settings`: every device's (default: read
    from the environment now, once)."""

    def __init__(self, specs: list[str] | None = None, settings=None):
        super().__init__("devices")
        self.devices: list[Device] = []
        self.instance = None
        try:
            if specs is None:
                self.devices.append(Device(settings=settings))
                return
            self.instance = Instance(settings=settings)
            profiles = self.instance.profiles()
            for k, spec in enumerate(specs):
                profile = select_device(profiles, spec, what="--device")
                self.devices.append(Device(str(profile.index), instance=self.instance, settings=settings,
                                           label=f"Vulkan{k} ({profile.name})"))
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.devices)

    def __getitem__(self, k: int) -> Device:
        return self.devices[k]

    def __iter__(self):
        return iter(self.devices)

    def _release(self) -> None:
        for dev in reversed(self.devices):
            dev.close()
        self.devices.clear()
        if self.instance is not None:
            self.instance.close()
