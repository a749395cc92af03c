"""Compiler statistics of a built kernel (VK_KHR_pipeline_executable_properties): registers,
spills, code size, occupancy, as the driver names them. The device must be opened with
Device(capture_statistics=True), which also makes every Kernel capture them."""

from __future__ import annotations

from ..device.vk import cstr, enumerate_structs, ffi, lib, vk
from ..errors import VkrtError

_FORMATS = {vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: lambda v: bool(v.b32),
            vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: lambda v: int(v.i64),
            vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: lambda v: int(v.u64),
            vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: lambda v: float(v.f64)}


def _device_function(device, name: str):
    fn = lib.vkGetDeviceProcAddr(device.handle, name.encode())
    if fn == ffi.NULL:
        raise VkrtError(f"{device.profile.name}: the driver has no {name}")
    return ffi.cast(f"PFN_{name}", fn)


def pipeline_statistics(kern) -> dict[str, int | float | bool]:
    """{statistic name: value} of `kern`'s compute pipeline (e.g. RADV: "VGPRs", "SGPRs",
    "Spilled VGPRs", "Code size", "LDS size", "Subgroups per SIMD", "Instructions"). Where a
    driver splits the pipeline into several executables, names get "<executable>: " prefixes."""
    device = kern.device
    if not device.capture_statistics:
        raise VkrtError(f"{kern.label}: open the device with capture_statistics=True to read compiler statistics")
    what = f"reading the compiler statistics of {kern.label}"
    pinfo = ffi.new("VkPipelineInfoKHR*")
    pinfo.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR
    pinfo.pipeline = kern.pipeline
    executables = enumerate_structs(_device_function(device, "vkGetPipelineExecutablePropertiesKHR"), (device.handle, pinfo),
                                    "VkPipelineExecutablePropertiesKHR",
                                    vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR, what)
    get_stats = _device_function(device, "vkGetPipelineExecutableStatisticsKHR")
    stats: dict[str, int | float | bool] = {}
    for index, exe in enumerate(executables):
        einfo = ffi.new("VkPipelineExecutableInfoKHR*")
        einfo.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR
        einfo.pipeline = kern.pipeline
        einfo.executableIndex = index
        prefix = f"{cstr(exe.name)}: " if len(executables) > 1 else ""
        for s in enumerate_structs(get_stats, (device.handle, einfo), "VkPipelineExecutableStatisticKHR",
                                   vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR, what):
            stats[prefix + cstr(s.name)] = _FORMATS[s.format](s.value)
    return stats
