"""Layer split (`-sm layer`): which layers each device holds. Device k of the split runs layers
ranges[k]; the token embedding lives on the first device, the output norm and matrix (and the
sampling) on the last, which is the main device (`-mg`). The split order is the device list
with the main device moved to its end."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..errors import ConfigError

OUTPUT_TENSORS = ("output_norm.weight", "output.weight", "output_norm.bias", "output.bias")


def split_proportions(values, n_devices: int, what: str = "-ts") -> list[float]:
    """`values` (e.g. the -ts list) as non-negative floats, one per device, not all zero."""
    props = [float(v) for v in values]
    if len(props) != n_devices:
        raise ConfigError(f"{what} gives {len(props)} proportion(s) for {n_devices} device(s); give one per device")
    if any(p < 0 for p in props) or not sum(props) > 0:
        raise ConfigError(f"{what} {','.join(f'{p:g}' for p in props)}: proportions must be >= 0 and not all zero")
    return props


def split_layers(n_layer: int, proportions: list[float]) -> list[range]:
    """Consecutive layer ranges, one per proportion, sized by them (llama.cpp's rule: layer il goes
    to the first device whose cumulative share exceeds il / n_layer)."""
    total = sum(proportions)
    cum, acc = [], 0.0
    for p in proportions:
        acc += p / total
        cum.append(acc)
    cum[-1] = 1.0 + 1e-9
    owner = [min(bisect.bisect_right(cum, il / n_layer), len(cum) - 1) for il in range(n_layer)]
    # a device given no layer gets the empty range where its layers would be (the last: past them all)
    return [range(bisect.bisect_left(owner, k), bisect.bisect_right(owner, k)) for k in range(len(proportions))]


def split_order(n_devices: int, main: int) -> list[int]:
    """Indices into the device list in split order: the main device last."""
    if not 0 <= main < n_devices:
        raise ConfigError(f"-mg {main}: the device list has {n_devices} device(s) (0..{n_devices - 1})")
    return [k for k in range(n_devices) if k != main] + [main]


@dataclass
class LayerSplit:
    """Devices in split order (each one a stage of the forward pass) and the layers each runs.
    Devices given no layer are left out, except the main (last) one, which runs the output."""

    devices: list
    ranges: list[range]

    def __post_init__(self):
        keep = [k for k, r in enumerate(self.ranges) if len(r) or k == len(self.ranges) - 1]
        self.devices = [self.devices[k] for k in keep]
        self.ranges = [self.ranges[k] for k in keep]

    @classmethod
    def plan(cls, devices: list, n_layer: int, proportions: list[float], main: int) -> "LayerSplit":
        """The split of n_layer layers over `devices` (in the user's order) by `proportions`
        (one per device, the user's order), the output on devices[main]."""
        order = split_order(len(devices), main)
        props = split_proportions(proportions, len(devices))
        return cls([devices[k] for k in order], split_layers(n_layer, [props[k] for k in order]))

    @property
    def main(self):
        return self.devices[-1]

    @property
    def n_stages(self) -> int:
        return len(self.devices)

    def stage_of_layer(self, il: int) -> int:
        for k, r in enumerate(self.ranges):
            if il in r:
                return k
        raise ConfigError(f"layer {il} is in no stage of the split ({self.describe()})")

    def stage_of(self, name: str) -> int:
        """The stage holding tensor `name`: its layer's, the first for the token embedding (and
        other tensors outside the layers), the last for the output norm and matrix."""
        if name.startswith("blk."):
            return self.stage_of_layer(int(name.split(".")[1]))
        if name in OUTPUT_TENSORS:
            return self.n_stages - 1
        return 0

    def describe(self) -> str:
        return "; ".join(f"{d.label}: layers {_span(r)}" for d, r in zip(self.devices, self.ranges))


def _span(r: range) -> str:
    return "none" if not len(r) else f"{r.start}" if len(r) == 1 else f"{r.start}-{r.stop - 1}"
