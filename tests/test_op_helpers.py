"""The ops' one grid helper (vkrt/ops/grid.py) and one binding helper (vkrt/ops/binding.py):
how a workgroup count folds past the device's x limit, and errors that name op and operand."""

from types import SimpleNamespace

import pytest

from vkrt.commands import CommandSequence
from vkrt.errors import GGMLTypeError, OutOfRange
from vkrt.memory import F32, I32, Buffer, Tensor
from vkrt.ops.binding import RangeTooLarge, bind, bind_elements, f32_binding
from vkrt.ops.grid import grid, groups_for
from vkrt.ops.norm import rms_norm


def limits(x: int, y: int = 65535, z: int = 65535):
    return SimpleNamespace(profile=SimpleNamespace(max_workgroup_count=(x, y, z)))


def test_grid_runs_along_x_and_folds_beyond_the_limit():
    small = limits(7, 1000, 1000)
    assert grid(small, 5) == (5, 1, 1)
    assert grid(small, 7, 3) == (7, 1, 3)
    assert grid(small, 8) == (7, 2, 1)
    assert grid(small, 0) == (1, 1, 1)
    assert grid(limits(65535), 65536) == (65535, 2, 1)
    assert grid(limits(2 ** 31 - 1), 100000) == (100000, 1, 1)
    assert grid(limits(2 ** 31 - 1), 2 ** 31) == (65535, 32769, 1)   # folded rows stay 65535 wide
    kernel = SimpleNamespace(device=small, workgroup=(64, 1, 1))
    assert groups_for(kernel, 64) == (1, 1, 1)
    assert groups_for(kernel, 65, 2) == (2, 1, 2)
    assert groups_for(kernel, 64 * 7 + 1) == (7, 2, 1)


def test_bind_offsets_and_errors_name_the_operand(device):
    align = device.profile.min_storage_buffer_offset_alignment
    with Buffer(device, 4 * align + 256) as buf:
        t = Tensor.on(buf.range(align + 20, 64), F32, (4, 4))
        start = (align + 20) // align * align   # rounded down to the device's offset alignment
        rng, off, strides = f32_binding(t, "rms_norm x")
        assert (rng.offset, off, strides) == (start, (align + 20 - start) // 4, (4, 16, 16))
        b = bind_elements(t.view((2, 2), nb=(8, 16)), "copy src")
        assert (b.range.offset, b.offset, b.strides[:2]) == (start, off, (2, 4))
        with pytest.raises(GGMLTypeError, match="rms_norm x: expected an F32 tensor, got I32"):
            f32_binding(Tensor.on(buf.range(0, 64), I32, (16,)), "rms_norm x")
        with pytest.raises(OutOfRange, match="rms_norm out: .* not a multiple of 4 bytes"):
            f32_binding(Tensor.on(buf.range(2, 64), F32, (16,)), "rms_norm out")
        with pytest.raises(OutOfRange, match=r"add x: dim 0 must be contiguous \(nb\[0\] = 4\)"):
            bind(t.view((2, 4), nb=(8, 16)), "add x", unit=4, contiguous=True)
        with pytest.raises(RangeTooLarge, match="matmul w: .* one binding may cover 32"):
            bind(t, "matmul w", max_binding=32)
    with Buffer(device, 66) as odd:   # its last word is half a word
        last = Tensor.on(odd.range(64, 2), "F16", (1,))
        r = bind(last, "copy src").range
        assert r.offset + r.size == 66   # clamped to the buffer
        with pytest.raises(OutOfRange, match="get_rows table: .* ends at byte 66 .* not a whole number of 32-bit words"):
            bind(last, "get_rows table", whole_words=True)


def test_an_op_names_its_operand(device):
    with Buffer(device, 1024) as buf, CommandSequence(device) as seq:
        x = Tensor.on(buf.range(0, 64), I32, (16,))
        y = Tensor.on(buf.range(256, 64), F32, (16,))
        with seq.record():
            with pytest.raises(GGMLTypeError, match="rms_norm x: expected an F32 tensor"):
                rms_norm(seq, x, y, 1e-6)
