"""DeviceProfile: everything vkrt needs to know about a physical device, read once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import VulkanError
from .architecture import VENDOR_NAMES, VENDOR_NVIDIA, Arch, detect_architecture
from .vk import cstr, enumerate_structs, ffi, lib, vk, vk_call, version_str

DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}


@dataclass(frozen=True)
class Heap:
    index: int
    size: int
    device_local: bool
    budget: int | None = None  # VK_EXT_memory_budget, when the driver reports it
    usage: int | None = None


@dataclass(frozen=True)
class MemoryType:
    index: int
    heap: int
    flags: int  # VkMemoryPropertyFlags

    @property
    def device_local(self) -> bool:
        return bool(self.flags & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)

    @property
    def host_visible(self) -> bool:
        return bool(self.flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)

    @property
    def host_coherent(self) -> bool:
        return bool(self.flags & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)

    @property
    def host_cached(self) -> bool:
        return bool(self.flags & vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)


@dataclass(frozen=True)
class QueueFamily:
    index: int
    count: int
    graphics: bool
    compute: bool
    transfer: bool
    timestamp_bits: int

    @property
    def dedicated_transfer(self) -> bool:
        return self.transfer and not self.compute and not self.graphics


@dataclass(frozen=True)
class DeviceProfile:
    """What a physical device is and can do. Built by query_profile(); tests build it by hand."""

    index: int
    name: str
    vendor_id: int
    device_id: int
    device_type: str
    api_version: str
    driver_id: int
    driver_name: str
    driver_info: str
    driver_version: str
    architecture: Arch
    detected_architecture: Arch
    subgroup_size: int
    subgroup_min: int
    subgroup_max: int
    subgroup_size_control: bool
    subgroup_arithmetic: bool
    subgroup_shuffle: bool
    shared_memory: int
    max_workgroup_invocations: int
    max_workgroup_size: tuple[int, int, int]
    max_workgroup_count: tuple[int, int, int]
    fp16_math: bool
    int8_math: bool
    int16_math: bool
    int64_math: bool
    storage_16bit: bool
    storage_8bit: bool
    int_dot: bool
    int_dot_accelerated: bool
    coopmat: bool
    coopmat2: bool
    timeline_semaphores: bool
    host_import: bool
    host_import_alignment: int
    max_storage_buffer_range: int
    max_buffer_size: int
    max_allocation_size: int
    min_storage_buffer_offset_alignment: int
    non_coherent_atom_size: int
    max_push_constants_size: int
    timestamp_period_ns: float
    memory_budget: bool
    heaps: tuple[Heap, ...]
    memory_types: tuple[MemoryType, ...]
    queue_families: tuple[QueueFamily, ...]
    extensions: frozenset[str] = field(default_factory=frozenset)
    # compute units (AMD CUs, NVIDIA SMs) where the driver says (VK_AMD_shader_core_properties,
    # VK_NV_shader_sm_builtins); None elsewhere
    compute_units: int | None = None
    # fp32 subnormals can be kept on request (DenormPreserve); devices flush them by default
    denorm_preserve_fp32: bool = False
    # a subgroup-scope 16 x 16 x 16 cooperative matrix product of fp16 operands into fp32
    # (VK_KHR_cooperative_matrix), and the Vulkan memory model its shaders are compiled for
    coopmat_f16: bool = False
    memory_model: bool = False

    @property
    def api(self) -> tuple[int, int]:
        major, minor = self.api_version.split(".")[:2]
        return int(major), int(minor)

    @property
    def vendor(self) -> str:
        return VENDOR_NAMES.get(self.vendor_id, f"0x{self.vendor_id:04x}")

    @property
    def vram(self) -> int:
        """Bytes of the largest device-local heap."""
        local = [h.size for h in self.heaps if h.device_local]
        return max(local) if local else 0

    @property
    def transfer_family(self) -> QueueFamily | None:
        """A queue family for DMA only (transfer without compute or graphics), if any."""
        return next((q for q in self.queue_families if q.dedicated_transfer), None)

    @property
    def compute_family(self) -> QueueFamily | None:
        return next((q for q in self.queue_families if q.compute), None)

    def with_architecture(self, arch: Arch) -> "DeviceProfile":
        return dataclasses.replace(self, architecture=arch)

    def identity(self) -> dict:
        """{"device": name, "architecture": value}: how every JSON report (bench-h2d, bench/)
        names the device it ran on."""
        return {"device": self.name, "architecture": self.architecture.value}

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["architecture"] = self.architecture.value
        d["detected_architecture"] = self.detected_architecture.value
        d["vendor"] = self.vendor
        d["vram"] = self.vram
        d["extensions"] = sorted(self.extensions)
        d["transfer_queue_family"] = self.transfer_family.index if self.transfer_family else None
        return d


def _driver_version(vendor_id: int, packed: int) -> str:
    if vendor_id == VENDOR_NVIDIA:
        return f"{(packed >> 22) & 0x3FF}.{(packed >> 14) & 0xFF}.{(packed >> 6) & 0xFF}.{packed & 0x3F}"
    return version_str(packed)


def _coopmat_f16(instance, physical_device) -> bool:
    """Whether the device lists a subgroup 16x16x16 fp16 x fp16 + fp32 -> fp32 configuration."""
    fn = lib.vkGetInstanceProcAddr(instance, b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    if fn == ffi.NULL:
        return False
    try:   # an optional feature: a driver that fails to list it does without
        configs = enumerate_structs(ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", fn),
                                    (physical_device,), "VkCooperativeMatrixPropertiesKHR",
                                    vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR,
                                    "listing the cooperative matrix configurations")
    except VulkanError:
        return False
    f16, f32 = vk.VK_COMPONENT_TYPE_FLOAT16_KHR, vk.VK_COMPONENT_TYPE_FLOAT32_KHR
    return any((c.MSize, c.NSize, c.KSize) == (16, 16, 16) and (c.AType, c.BType, c.CType, c.ResultType) == (f16, f16, f32, f32)
               and c.scope == vk.VK_SCOPE_SUBGROUP_KHR for c in configs)


def _compute_units(amd, sm) -> int | None:
    if amd is not None:
        units = amd.shaderEngineCount * amd.shaderArraysPerEngineCount * amd.computeUnitsPerShaderArray
        return units or None
    if sm is not None:
        return sm.shaderSMCount or None
    return None


def query_profile(physical_device, index: int, arch: Arch | None = None, instance=None) -> DeviceProfile:
    """Read a physical device's properties, features, memory and queues into a DeviceProfile;
    `arch` overrides the detected architecture (VKRT_ARCH); `instance` (its handle) lets the
    cooperative matrix configurations be listed."""
    with vk_call(f"querying physical device {index}"):
        exts = frozenset(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical_device, None))
        base = vk.vkGetPhysicalDeviceProperties(physical_device)
        api = base.apiVersion
        is13 = (api >> 22, (api >> 12) & 0x3FF) >= (1, 3)

        # properties chain: only structs the device knows
        p11 = vk.VkPhysicalDeviceVulkan11Properties()
        p12 = vk.VkPhysicalDeviceVulkan12Properties(pNext=p11)
        head = p12
        p13 = host = amd = sgc = dot = sm = None
        if is13:
            p13 = head = vk.VkPhysicalDeviceVulkan13Properties(pNext=head)
        elif "VK_EXT_subgroup_size_control" in exts:
            sgc = head = vk.VkPhysicalDeviceSubgroupSizeControlPropertiesEXT(pNext=head)
        if "VK_EXT_external_memory_host" in exts:
            host = head = vk.VkPhysicalDeviceExternalMemoryHostPropertiesEXT(pNext=head)
        if "VK_AMD_shader_core_properties" in exts:
            amd = head = vk.VkPhysicalDeviceShaderCorePropertiesAMD(pNext=head)
        if "VK_NV_shader_sm_builtins" in exts:
            sm = head = vk.VkPhysicalDeviceShaderSMBuiltinsPropertiesNV(pNext=head)
        if not is13 and "VK_KHR_shader_integer_dot_product" in exts:
            dot = head = vk.VkPhysicalDeviceShaderIntegerDotProductPropertiesKHR(pNext=head)
        props2 = vk.VkPhysicalDeviceProperties2(pNext=head)
        vk.vkGetPhysicalDeviceProperties2(physical_device, props2)
        props = props2.properties
        limits = props.limits

        f11 = vk.VkPhysicalDeviceVulkan11Features()
        f12 = vk.VkPhysicalDeviceVulkan12Features(pNext=f11)
        fhead = f12
        f13 = dotf = None
        if is13:
            f13 = fhead = vk.VkPhysicalDeviceVulkan13Features(pNext=fhead)
        elif "VK_KHR_shader_integer_dot_product" in exts:
            dotf = fhead = vk.VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR(pNext=fhead)
        feats2 = vk.VkPhysicalDeviceFeatures2(pNext=fhead)
        vk.vkGetPhysicalDeviceFeatures2(physical_device, feats2)
        feats = feats2.features

        budget_struct = None
        if "VK_EXT_memory_budget" in exts:
            budget_struct = vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT()
            mem2 = vk.VkPhysicalDeviceMemoryProperties2(pNext=budget_struct)
        else:
            mem2 = vk.VkPhysicalDeviceMemoryProperties2()
        vk.vkGetPhysicalDeviceMemoryProperties2(physical_device, mem2)
        mem = mem2.memoryProperties
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical_device)
        coopmat_f16 = (instance is not None and "VK_KHR_cooperative_matrix" in exts
                       and _coopmat_f16(instance, physical_device))

    sub_props = p13 if p13 is not None else sgc
    subgroup_min = sub_props.minSubgroupSize if sub_props is not None else p11.subgroupSize
    subgroup_max = sub_props.maxSubgroupSize if sub_props is not None else p11.subgroupSize
    dot_props = p13 if p13 is not None else dot
    int_dot_feature = bool(f13.shaderIntegerDotProduct) if f13 is not None else bool(dotf and dotf.shaderIntegerDotProduct)
    int_dot_accel = bool(dot_props and dot_props.integerDotProduct4x8BitPackedSignedAccelerated)
    mixed_accel = bool(dot_props and dot_props.integerDotProduct4x8BitPackedMixedSignednessAccelerated)
    sgc_feature = bool(f13.subgroupSizeControl) if f13 is not None else sgc is not None

    ops = p11.subgroupSupportedOperations
    detected = detect_architecture(
        vendor_id=props.vendorID,
        device_type=props.deviceType,
        driver_id=p12.driverID,
        subgroup_min=subgroup_min,
        subgroup_max=subgroup_max,
        extensions=exts,
        wavefronts_per_simd=amd.wavefrontsPerSimd if amd is not None else None,
        int_dot_mixed_accelerated=mixed_accel,
    )
    heaps = tuple(
        Heap(
            index=i,
            size=mem.memoryHeaps[i].size,
            device_local=bool(mem.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT),
            budget=budget_struct.heapBudget[i] if budget_struct is not None else None,
            usage=budget_struct.heapUsage[i] if budget_struct is not None else None,
        )
        for i in range(mem.memoryHeapCount)
    )
    types = tuple(
        MemoryType(index=i, heap=mem.memoryTypes[i].heapIndex, flags=mem.memoryTypes[i].propertyFlags)
        for i in range(mem.memoryTypeCount)
    )
    queues = tuple(
        QueueFamily(
            index=i,
            count=q.queueCount,
            graphics=bool(q.queueFlags & vk.VK_QUEUE_GRAPHICS_BIT),
            compute=bool(q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT),
            transfer=bool(q.queueFlags & (vk.VK_QUEUE_TRANSFER_BIT | vk.VK_QUEUE_COMPUTE_BIT | vk.VK_QUEUE_GRAPHICS_BIT)),
            timestamp_bits=q.timestampValidBits,
        )
        for i, q in enumerate(families)
    )
    max_alloc = p11.maxMemoryAllocationSize
    max_buffer = p13.maxBufferSize if p13 is not None else max_alloc
    return DeviceProfile(
        index=index,
        name=cstr(props.deviceName),
        vendor_id=props.vendorID,
        device_id=props.deviceID,
        device_type=DEVICE_TYPES.get(props.deviceType, "other"),
        api_version=version_str(api),
        driver_id=p12.driverID,
        driver_name=cstr(p12.driverName),
        driver_info=cstr(p12.driverInfo),
        driver_version=_driver_version(props.vendorID, props.driverVersion),
        architecture=arch or detected,
        detected_architecture=detected,
        subgroup_size=p11.subgroupSize,
        subgroup_min=subgroup_min,
        subgroup_max=subgroup_max,
        subgroup_size_control=sgc_feature,
        subgroup_arithmetic=bool(ops & vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT),
        subgroup_shuffle=bool(ops & vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT),
        shared_memory=limits.maxComputeSharedMemorySize,
        max_workgroup_invocations=limits.maxComputeWorkGroupInvocations,
        max_workgroup_size=tuple(limits.maxComputeWorkGroupSize),
        max_workgroup_count=tuple(limits.maxComputeWorkGroupCount),
        fp16_math=bool(f12.shaderFloat16),
        int8_math=bool(f12.shaderInt8),
        int16_math=bool(feats.shaderInt16),
        int64_math=bool(feats.shaderInt64),
        storage_16bit=bool(f11.storageBuffer16BitAccess),
        storage_8bit=bool(f12.storageBuffer8BitAccess),
        int_dot=int_dot_feature,
        int_dot_accelerated=int_dot_feature and int_dot_accel,
        coopmat="VK_KHR_cooperative_matrix" in exts,
        coopmat2="VK_NV_cooperative_matrix2" in exts,
        timeline_semaphores=bool(f12.timelineSemaphore),
        host_import="VK_EXT_external_memory_host" in exts,
        host_import_alignment=host.minImportedHostPointerAlignment if host is not None else 0,
        max_storage_buffer_range=limits.maxStorageBufferRange,
        max_buffer_size=max_buffer,
        max_allocation_size=max_alloc,
        min_storage_buffer_offset_alignment=limits.minStorageBufferOffsetAlignment,
        non_coherent_atom_size=limits.nonCoherentAtomSize,
        max_push_constants_size=limits.maxPushConstantsSize,
        timestamp_period_ns=float(limits.timestampPeriod),
        memory_budget=budget_struct is not None,
        heaps=heaps,
        memory_types=types,
        queue_families=queues,
        compute_units=_compute_units(amd, sm),
        denorm_preserve_fp32=bool(p12.shaderDenormPreserveFloat32),
        coopmat_f16=coopmat_f16,
        memory_model=bool(f12.vulkanMemoryModel),
        extensions=exts,
    )
