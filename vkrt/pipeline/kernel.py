"""Kernel: SPIR-V + specialisation constants + push-constant layout + storage-buffer bindings,
made into a compute pipeline. Get them through `kernel(device, ...)`, which caches per device."""

from __future__ import annotations

import logging
import struct
import threading
import time

from ..commands.descriptors import storage_set_layout
from ..device.vk import ffi, vk, vk_call
from ..errors import KernelInterfaceError
from ..owned import Owned
from ..units import fmt_bytes
from .compiler import compile_shader
from .push_constants import MAX_PUSH_BYTES, PushConstants
from .quant_tables import TABLES_BLOCK, TABLES_SET, quant_tables
from .spirv import reflect

log = logging.getLogger("vkrt")

_SPEC_FORMATS = {"int": "<i", "uint": "<I", "float": "<f", "bool": "<I"}


class Kernel(Owned):
    """A compute pipeline for shaders/<shader>.comp. `workgroup` sets the local_size_*_id
    specialisation constants; `spec` sets other constant_id values; `push` must match the
    shader's push_constant block exactly."""

    def __init__(self, device, shader: str, *, defines: dict | None = None, push: PushConstants | None = None,
                 spec: dict[int, int | float | bool] | None = None, workgroup: tuple[int, ...] | None = None,
                 source: str | None = None, label: str | None = None):
        label = label or shader
        super().__init__(label)
        self.device = device
        self.shader = shader
        self.defines = dict(defines or {})
        self.module = self.set_layout = self.layout = self.pipeline = None
        try:
            self._build(self.defines, push, dict(spec or {}), workgroup, source)
        except BaseException:
            self.close()
            raise
        device.adopt(self)

    def _build(self, defines, push, spec, workgroup, source) -> None:
        dev = self.device
        t0 = time.perf_counter()
        spirv = compile_shader(self.shader, defines, source, cache_dir=dev.settings.shader_cache_dir,
                               glslang_lib=dev.settings.glslang_lib)
        iface = reflect(spirv)
        self.interface = iface
        name = f"shader {self.shader}"
        if iface.push_size and push is None:
            raise KernelInterfaceError(f"{name} has a {iface.push_size}-byte push-constant block but no Python layout")
        if push is not None and not iface.push_size:
            raise KernelInterfaceError(f"{name} has no push-constant block but a Python layout {push!r} was given")
        self.push = push or PushConstants()
        if push is not None:
            push.check(iface, name)
        self.push_size = self.push.size
        if self.push_size > min(MAX_PUSH_BYTES, dev.profile.max_push_constants_size):
            raise KernelInterfaceError(f"{name}: {self.push_size} bytes of push constants exceed the limit")
        indices = sorted(iface.bindings)
        if indices != list(range(len(indices))):
            raise KernelInterfaceError(f"{name}: bindings must be 0..n-1 in set 0, got {indices}")
        self.bindings = [iface.bindings[i] for i in indices]
        # set 1 may hold the IQ grids' buffer (quant_tables.py), bound by every dispatch of the kernel
        self.tables = None
        if iface.other_sets:
            if [(b.set, b.binding, b.name) for b in iface.other_sets] != [(TABLES_SET, 0, TABLES_BLOCK)]:
                raise KernelInterfaceError(f"{name}: the only binding outside set 0 may be set {TABLES_SET} binding 0, "
                                           f"block {TABLES_BLOCK}; got {iface.other_sets}")
            self.tables = quant_tables(dev)
        if iface.shared_bytes > dev.profile.shared_memory:
            raise KernelInterfaceError(f"{name} uses {fmt_bytes(iface.shared_bytes)} of shared memory; "
                                       f"{dev.profile.name} has {fmt_bytes(dev.profile.shared_memory)}")

        size = list(iface.local_size)
        for axis, value in enumerate(workgroup or ()):
            sid = iface.local_size_spec_ids[axis]
            if sid is None:
                if value != size[axis]:
                    raise KernelInterfaceError(f"{name}: local_size {'xyz'[axis]} is fixed at {size[axis]}, "
                                               f"cannot set {value} (use local_size_{'xyz'[axis]}_id)")
                continue
            spec[sid] = value
            size[axis] = value
        for axis, sid in enumerate(iface.local_size_spec_ids):
            if sid is not None and sid in spec:
                size[axis] = spec[sid]
        self.workgroup = tuple(size)
        invocations = size[0] * size[1] * size[2]
        if invocations > dev.profile.max_workgroup_invocations:
            raise KernelInterfaceError(f"{name}: workgroup {self.workgroup} has {invocations} invocations; "
                                       f"the device allows {dev.profile.max_workgroup_invocations}")
        unknown = set(spec) - set(iface.spec_constants)
        if unknown:
            raise KernelInterfaceError(f"{name} has no specialisation constant(s) {sorted(unknown)}; "
                                       f"it declares {sorted(iface.spec_constants)}")

        d = dev.handle
        with vk_call(f"creating the pipeline of {name} ({self.label})"):
            self.module = vk.vkCreateShaderModule(d, vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv), None)
            self.set_layout = storage_set_layout(dev, len(indices))
            ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                             size=self.push_size)] if self.push_size else []
            set_layouts = [self.set_layout] + ([self.tables.set_layout] if self.tables else [])
            self.layout = vk.vkCreatePipelineLayout(d, vk.VkPipelineLayoutCreateInfo(
                setLayoutCount=len(set_layouts), pSetLayouts=set_layouts, pushConstantRangeCount=len(ranges),
                pPushConstantRanges=ranges or None), None)
            spec_info = None
            if spec:
                entries, blob = [], b""
                for sid, value in sorted(spec.items()):
                    packed = struct.pack(_SPEC_FORMATS[iface.spec_constants[sid]], value)
                    entries.append(vk.VkSpecializationMapEntry(constantID=sid, offset=len(blob), size=4))
                    blob += packed
                self._spec_blob = ffi.new("char[]", blob)
                spec_info = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries,
                                                    dataSize=len(blob), pData=self._spec_blob)
            stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module,
                                                       pName="main", pSpecializationInfo=spec_info)
            flags = ((vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR if dev.capture_statistics else 0)
                     | (vk.VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR if dev.capture_disassembly else 0))
            info = vk.VkComputePipelineCreateInfo(flags=flags, stage=stage, layout=self.layout)
            t1 = time.perf_counter()
            self.pipeline = vk.vkCreateComputePipelines(d, ffi.NULL, 1, [info], None)[0]
        log.debug("pipeline %s (defines %s, spec %s): SPIR-V in %.0f ms, created in %.0f ms", self.label, defines,
                  spec, (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3)

    def _release(self) -> None:
        d = self.device.handle
        self.device.forget(self)
        if self.pipeline is not None:
            vk.vkDestroyPipeline(d, self.pipeline, None)
        if self.layout is not None:
            vk.vkDestroyPipelineLayout(d, self.layout, None)
        if self.set_layout is not None:
            vk.vkDestroyDescriptorSetLayout(d, self.set_layout, None)
        if self.module is not None:
            vk.vkDestroyShaderModule(d, self.module, None)
        self.pipeline = self.layout = self.set_layout = self.module = None


class KernelCache(Owned):
    """One Kernel per (shader, defines, push layout, spec constants, workgroup) on a device."""

    def __init__(self, device):
        super().__init__("kernel cache")
        self.device = device
        self._kernels: dict[tuple, Kernel] = {}
        self._lock = threading.Lock()

    def get(self, shader: str, *, defines: dict | None = None, push: PushConstants | None = None,
            spec: dict | None = None, workgroup: tuple[int, ...] | None = None) -> Kernel:
        key = (shader, tuple(sorted((defines or {}).items())), push, tuple(sorted((spec or {}).items())),
               tuple(workgroup or ()))
        with self._lock:
            k = self._kernels.get(key)
            if k is None or k.closed:
                k = self._kernels[key] = Kernel(self.device, shader, defines=defines, push=push, spec=spec,
                                                workgroup=workgroup)
            return k

    def __len__(self) -> int:
        return len(self._kernels)

    def _release(self) -> None:
        for k in self._kernels.values():
            k.close()
        self._kernels.clear()


def kernel(device, shader: str, **kw) -> Kernel:
    """The device's cached Kernel for `shader` with these options (see Kernel)."""
    return device.service("kernels", KernelCache).get(shader, **kw)
