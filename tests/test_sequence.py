"""Command sequences: record once and replay, automatic barriers, copies, timestamps, misuse."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, download, upload
from vkrt.errors import VkrtError
from vkrt.memory import F32, Buffer, Tensor, allocate
from vkrt.ops.elementwise import add, fill


def f32(buf, n):
    return Tensor.on(buf.range(), F32, (n,))


def test_replay_gives_the_same_result(device):
    n = 333
    a = np.random.default_rng(0).random(n, dtype=np.float32)
    with Buffer(device, 4 * n) as acc, Buffer(device, 4 * n) as inc, CommandSequence(device) as seq:
        upload(device, acc, np.zeros(n, np.float32))
        upload(device, inc, a)
        with seq.record():
            add(seq, f32(acc, n), f32(inc, n), f32(acc, n))  # acc += inc
        for _ in range(5):
            seq.run()  # replayed, not re-recorded
        np.testing.assert_array_equal(download(device, acc, np.float32), a + a + a + a + a)
        seq.run()
        seq.run()
        expect = a.copy()
        for _ in range(6):
            expect = expect + a
        np.testing.assert_array_equal(download(device, acc, np.float32), expect)


def test_barriers_only_where_needed(device):
    n = 256
    with Buffer(device, 4 * n) as x, Buffer(device, 4 * n) as y, Buffer(device, 4 * n) as z, \
            CommandSequence(device) as seq:
        with seq.record():
            fill(seq, x, n, 0x3F800000)  # x = 1
            fill(seq, y, n, 0x40000000)  # y = 2: independent, no barrier
            assert seq.barrier_count == 0
            add(seq, f32(x, n), f32(y, n), f32(z, n))  # reads x, y after their writes: one barrier
            assert seq.barrier_count == 1
            add(seq, f32(x, n), f32(y, n), f32(x, n))  # writes x which the last add read (WAR): barrier
            assert seq.barrier_count == 2
        seq.run()
        np.testing.assert_array_equal(download(device, z, np.float32), np.full(n, 3, np.float32))
        np.testing.assert_array_equal(download(device, x, np.float32), np.full(n, 3, np.float32))


def test_barriers_between_commands_name_only_shader_and_transfer_access(device):
    """The generic MEMORY_* bits made NVIDIA's driver flush at every barrier (21% of a decode step)."""
    from vkrt.device.vk import vk
    generic = vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT
    n = 64
    with Buffer(device, 4 * n) as x, Buffer(device, 4 * n) as z, CommandSequence(device) as seq:
        with seq.record():
            fill(seq, x, n, 0x3F800000)
            add(seq, f32(x, n), f32(x, n), f32(z, n))
            assert seq.barrier_count == 1
            b = seq._barrier
            assert b.srcAccessMask & generic == 0 and b.dstAccessMask & generic == 0
            assert b.srcAccessMask & vk.VK_ACCESS_SHADER_WRITE_BIT and b.dstAccessMask & vk.VK_ACCESS_SHADER_READ_BIT
        seq.run()
        np.testing.assert_array_equal(download(device, z, np.float32), np.full(n, 2, np.float32))


def test_copy_fill_and_rerecord(device):
    with Buffer(device, 4096) as src, Buffer(device, 4096) as dst, CommandSequence(device) as seq:
        upload(device, src, np.arange(1024, dtype=np.uint32))
        with seq.record():
            seq.fill(dst.range(0, 4096), 7)
            seq.copy(src.range(0, 400), dst.range(1000, 400))
        seq.run()
        out = download(device, dst, np.uint32)
        expect = np.full(1024, 7, np.uint32)
        expect[250:350] = np.arange(100)
        np.testing.assert_array_equal(out, expect)
        with seq.record():  # a new recording replaces the old one
            seq.fill(dst, 9)
        seq.run()
        np.testing.assert_array_equal(download(device, dst, np.uint32), np.full(1024, 9, np.uint32))


def test_copy_regions_in_one_command(device):
    """copy_regions: several (src offset, dst offset, size) regions in one vkCmdCopyBuffer, each
    landing where copy() would put it; a region outside either buffer is refused."""
    with Buffer(device, 4096) as src, Buffer(device, 4096) as dst, CommandSequence(device) as seq:
        upload(device, src, np.arange(1024, dtype=np.uint32))
        with seq.record():
            seq.fill(dst.range(0, 4096), 7)
            seq.copy_regions(src, dst, [(0, 2048, 16), (400, 0, 8), (4000, 100 * 4, 96)])
        seq.run()
        out = download(device, dst, np.uint32)
        expect = np.full(1024, 7, np.uint32)
        expect[512:516] = np.arange(4)
        expect[0:2] = [100, 101]
        expect[100:124] = np.arange(1000, 1024)
        np.testing.assert_array_equal(out, expect)
        with pytest.raises(VkrtError, match="outside"), seq.record():
            seq.copy_regions(src, dst, [(4090, 0, 16)])


def test_timestamps(device):
    family = device.profile.queue_families[device.compute.family]
    if family.timestamp_bits == 0:
        pytest.skip("no timestamps on this queue")
    n = 1 << 16
    with Buffer(device, 4 * n) as x, CommandSequence(device, timestamps=True) as seq:
        with seq.record():
            fill(seq, x, n, 1)
            seq.fill(x, 2, label="clear")
        seq.run()
        times = seq.gpu_times()
        assert [label for label, _ in times] == ["fill", "clear"]
        assert all(t >= 0 for _, t in times) and seq.gpu_time() > 0


PUSH = {"n": 1, "nb": 1, "a_off": 0, "b_off": 0, "d_off": 0, "scale": 1.0}


def test_misuse_is_reported(device):
    with Buffer(device, 64) as x, CommandSequence(device) as seq:
        with pytest.raises(VkrtError, match="nothing recorded"):
            seq.submit()
        with pytest.raises(VkrtError, match="between begin"):
            fill(seq, x, 4, 0)
        from vkrt.pipeline import kernel
        from vkrt.ops.elementwise import BINARY_PUSH
        k = kernel(device, "binary", defines={"OP": 0}, push=BINARY_PUSH, workgroup=(device.tuning.wg_size,))
        with seq.record():
            with pytest.raises(VkrtError, match="3 bindings, got 1"):
                seq.dispatch(k, [x], push=PUSH)
            with pytest.raises(VkrtError, match="offset alignment"):
                seq.dispatch(k, [x.range(4, 8), x, x], push=PUSH)
            with pytest.raises(VkrtError, match="outside"):
                seq.copy(x.range(0, 64), type(x.range())(x, 32, 64))
            with pytest.raises(VkrtError, match="workgroup count"):
                seq.dispatch(k, [x, x, x], push=PUSH, groups=(0, 1, 1))
        with pytest.raises(VkrtError, match="needs 4000 bytes"):
            add(seq, f32(x, 1000), f32(x, 1000), f32(x, 1000))


def test_large_launch_folds_into_two_dimensions(device):
    n = device.profile.max_workgroup_count[0] * device.tuning.wg_size + 5
    if n * 4 > (256 << 20):
        pytest.skip("grid fold needs a buffer too large for this device's x limit")
    a = allocate(device, 4 * n, label="big")
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                fill(seq, a, n, 5)
            seq.run()
        out = download(device, a.range(4 * (n - 10), 40), np.uint32)
        np.testing.assert_array_equal(out, np.full(10, 5, np.uint32))
    finally:
        a.close()


def test_many_dispatches_grow_the_descriptor_pools(device):
    """More descriptor sets than one pool holds: the arena moves on to new pools, and a
    re-recording reuses them."""
    from vkrt.commands.descriptors import SETS_PER_POOL
    n = 64
    with Buffer(device, 4 * n) as x, CommandSequence(device) as seq:
        for _ in range(2):
            with seq.record():
                for i in range(2 * SETS_PER_POOL + 10):
                    fill(seq, x, n, i)
            seq.run()
            assert len(seq._descriptors._pools) == 3
            np.testing.assert_array_equal(download(device, x, np.uint32), np.full(n, 2 * SETS_PER_POOL + 9))
