"""Opening devices: the profile, queues, selection by VKRT_DEVICE, validation routing."""

import dataclasses

import pytest

from conftest import expect_lavapipe
from vkrt.device import Arch, Device, Instance
from vkrt.device.selection import select_device
from vkrt.errors import DeviceNotFound, UnsupportedDevice, ValidationError


def test_runs_on_lavapipe_when_expected(device):
    if not expect_lavapipe():
        pytest.skip("VKRT_EXPECT_LAVAPIPE is not set")
    assert device.profile.detected_architecture is Arch.LLVMPIPE
    assert device.profile.device_type == "cpu"
    assert "llvmpipe" in device.profile.name


def test_profile_is_sane(device):
    p = device.profile
    assert p.api >= (1, 2)
    assert p.timeline_semaphores
    assert p.subgroup_min <= p.subgroup_size <= p.subgroup_max
    assert p.shared_memory >= 16384
    assert p.max_storage_buffer_range >= 1 << 27
    assert p.heaps and p.memory_types and p.queue_families
    assert p.compute_family is not None
    if p.host_import:
        assert p.host_import_alignment > 0 and p.host_import_alignment & (p.host_import_alignment - 1) == 0
    d = p.to_dict()
    assert d["architecture"] == p.architecture.value and isinstance(d["extensions"], list)


def test_queues(device):
    assert device.compute.family == device.profile.compute_family.index
    if device.profile.transfer_family is None:
        assert device.transfer is device.compute and not device.has_transfer_queue
    else:
        assert device.transfer.family == device.profile.transfer_family.index


def test_select_by_index_and_name(device, monkeypatch):
    profiles = [device.profile]
    assert select_device(profiles, "0") is device.profile
    assert select_device(profiles, device.profile.name[:5].upper()) is device.profile
    with pytest.raises(DeviceNotFound, match="there are 1 devices"):
        select_device(profiles, "3")
    with pytest.raises(DeviceNotFound, match="matches no device"):
        select_device(profiles, "no such gpu")
    monkeypatch.setenv("VKRT_DEVICE", "9")
    with pytest.raises(DeviceNotFound):
        Device()


def test_default_prefers_discrete_then_integrated(device):
    p = device.profile
    cpu = dataclasses.replace(p, index=0, device_type="cpu")
    igpu = dataclasses.replace(p, index=1, device_type="integrated")
    dgpu = dataclasses.replace(p, index=2, device_type="discrete")
    virt = dataclasses.replace(p, index=3, device_type="virtual")
    assert select_device([cpu, igpu, dgpu, virt], "").index == 2
    assert select_device([cpu, igpu, virt], "").index == 1
    assert select_device([cpu, virt], "").index == 3
    old = dataclasses.replace(p, index=4, device_type="discrete", api_version="1.1.0")
    assert select_device([cpu, old], "").index == 0
    with pytest.raises(UnsupportedDevice, match="Vulkan 1.2"):
        select_device([old], "0")


def test_validation_errors_are_reported():
    inst = Instance(validate=True)
    if not inst.validating:
        inst.close()
        pytest.skip("the Khronos validation layer is not installed")
    from vkrt.device.vk import vk
    dev = Device(instance=inst)
    try:
        info = vk.VkBufferCreateInfo(size=0, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)  # size 0 is invalid
        try:
            vk.vkDestroyBuffer(dev.handle, vk.vkCreateBuffer(dev.handle, info, None), None)
        except (vk.VkError, vk.VkException):
            pass
        assert inst.validation_errors, "the layer reported nothing"
        with pytest.raises(ValidationError, match="validation error"):
            dev.check_validation()
        dev.check_validation()  # reported errors are cleared once raised
    finally:
        dev.close()
        inst.close()


def test_enumerated_structs_outlive_their_call():
    """enumerate_structs' items point into one cffi array, which the returned list keeps alive: freed,
    its memory went to the next array of that size, and the items read that array's zeros."""
    from vkrt.device.vk import enumerate_structs, ffi, vk

    def fill(count, out):   # a Vulkan-style two-call enumeration of 3 statistics
        if out == ffi.NULL:
            count[0] = 3
        else:
            for i in range(count[0]):
                out[i].value.u64 = 1000 + i
        return vk.VK_SUCCESS

    got = enumerate_structs(fill, (), "VkPipelineExecutableStatisticKHR",
                            vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR, "test")
    reuse = [ffi.new("VkPipelineExecutableStatisticKHR[]", 3) for _ in range(64)]
    assert [s.value.u64 for s in got] == [1000, 1001, 1002]
    assert all(s.sType == vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR for s in got)
    assert reuse
