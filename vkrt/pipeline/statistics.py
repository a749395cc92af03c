"""Compiler statistics of a built kernel (VK_KHR_pipeline_executable_properties): registers,
spills, code size, occupancy, as the driver names them, and the compiler's internal
representations (RADV: NIR, ACO's IR, the GCN assembly). The device must be opened with
Device(capture_statistics=True), which also makes every Kernel capture them (and
capture_disassembly=True for the representations)."""

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


def _executables(kern, what: str) -> list[tuple[str, object]]:
    """(name, VkPipelineExecutableInfoKHR*) of each executable of `kern`'s compute pipeline."""
    device = kern.device
    pinfo = ffi.new("VkPipelineInfoKHR*")
    pinfo.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR
    pinfo.pipeline = kern.pipeline
    executables = enumerate_structs(_device_function(device, "vkGetPipelineExecutablePropertiesKHR"), (device.handle, pinfo),
                                    "VkPipelineExecutablePropertiesKHR",
                                    vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR, what)
    out = []
    for index, exe in enumerate(executables):
        einfo = ffi.new("VkPipelineExecutableInfoKHR*")
        einfo.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR
        einfo.pipeline = kern.pipeline
        einfo.executableIndex = index
        out.append((cstr(exe.name), einfo))
    return out


def pipeline_representations(kern) -> dict[str, str]:
    """{representation name: text} of `kern`'s compute pipeline as the driver gives them (RADV:
    "NIR Shader(s)", "ACO IR", "Assembly"), names prefixed "<executable>: " where a driver
    splits the pipeline into several executables. Binary representations are left out."""
    device = kern.device
    if not getattr(device, "capture_disassembly", False):
        raise VkrtError(f"{kern.label}: open the device with capture_disassembly=True to read its compiler's "
                        "representations")
    what = f"reading the compiler's representations of {kern.label}"
    get = _device_function(device, "vkGetPipelineExecutableInternalRepresentationsKHR")
    executables = _executables(kern, what)
    reps: dict[str, str] = {}
    for exe_name, einfo in executables:
        prefix = f"{exe_name}: " if len(executables) > 1 else ""
        listed = enumerate_structs(get, (device.handle, einfo), "VkPipelineExecutableInternalRepresentationKHR",
                                   vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR, what)
        count = ffi.new("uint32_t*", len(listed))
        out = ffi.new("VkPipelineExecutableInternalRepresentationKHR[]", len(listed))
        buffers = []
        for item, seen in zip(out, listed):
            item.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR
            buffers.append(ffi.new("char[]", max(1, seen.dataSize)))
            item.dataSize = seen.dataSize
            item.pData = buffers[-1]
        result = get(device.handle, einfo, count, out)
        if result not in (vk.VK_SUCCESS, vk.VK_INCOMPLETE):
            raise VkrtError(f"{what}: the driver returned VkResult {result}")
        for item, buf in zip(out, buffers):
            if item.isText:
                reps[prefix + cstr(item.name)] = ffi.string(buf, item.dataSize).decode("utf-8", "replace")
    return reps


def pipeline_statistics(kern) -> dict[str, int | float | bool]:
    """{statistic name: value} of `kern`'s compute pipeline (e.g. RADV: "VGPRs", "SGPRs",
    "Spilled VGPRs", "Code size", "LDS size", "Subgroups per SIMD", "Instructions"). Where a
    driver splits the pipeline into several executables, names get "<executable>: " prefixes."""
    device = kern.device
    if not device.capture_statistics:
        raise VkrtError(f"{kern.label}: open the device with capture_statistics=True to read compiler statistics")
    what = f"reading the compiler statistics of {kern.label}"
    get_stats = _device_function(device, "vkGetPipelineExecutableStatisticsKHR")
    stats: dict[str, int | float | bool] = {}
    executables = _executables(kern, what)
    for exe_name, einfo in executables:
        prefix = f"{exe_name}: " if len(executables) > 1 else ""
        for s in enumerate_structs(get_stats, (device.handle, einfo), "VkPipelineExecutableStatisticKHR",
                                   vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR, what):
            stats[prefix + cstr(s.name)] = _FORMATS[s.format](s.value)
    return stats
