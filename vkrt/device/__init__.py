"""Lowest layer: instance, physical-device choice, DeviceProfile, tuning table, queues."""

from .architecture import Arch, detect_architecture, parse_arch
from .device import Device
from .instance import Instance
from .profile import DeviceProfile
from .tune import parse_tune, tuning_for
from .tuning import TABLE, Tuning

__all__ = ["Arch", "Device", "DeviceProfile", "Instance", "TABLE", "Tuning", "detect_architecture",
           "parse_arch", "parse_tune", "tuning_for"]
