"""Every object created on a device is closed with it; live counts return to where they were."""

import numpy as np

from vkrt.commands import CommandSequence, download, upload
from vkrt.device import Device
from vkrt.memory import F32, Buffer, MemoryKind, Tensor
from vkrt.ops.elementwise import add
from vkrt.owned import live_objects


def test_counts_return_to_zero_after_with_device(device):
    before = live_objects()
    with Device() as dev:
        a = Tensor.empty(dev, F32, (100,), name="a")
        Buffer(dev, 4096, MemoryKind.HOST, label="forgotten")  # never closed by hand
        upload(dev, a.range(), np.ones(100, np.float32))
        seq = CommandSequence(dev)
        with seq.record():
            add(seq, a, a, a)
        seq.run()
        assert download(dev, a.range(), np.float32)[0] == 2
        during = live_objects()
        assert during["Kernel"] >= before.get("Kernel", 0) + 1
    assert live_objects() == before


def test_close_is_idempotent(device):
    b = Buffer(device, 64)
    b.close()
    b.close()
    assert b.closed
