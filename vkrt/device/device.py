"""Device: the logical device, its queues, and the owner of everything created on it."""

from __future__ import annotations

import logging
import weakref
from typing import Callable, TypeVar

from ..errors import UnsupportedDevice, ValidationError, VkrtError
from ..owned import Owned
from ..settings import Settings
from .instance import Instance
from .profile import DeviceProfile
from .queue import Queue
from .selection import select_device
from .tune import describe_tune, parse_tune, tuning_for
from .tuning import Tuning
from .vk import vk, vk_call

log = logging.getLogger("vkrt")

T = TypeVar("T")

OPTIONAL_EXTENSIONS = (
    "VK_EXT_external_memory_host",
    "VK_KHR_external_memory",
    "VK_EXT_memory_budget",
    "VK_EXT_subgroup_size_control",
)
STATISTICS_EXTENSION = "VK_KHR_pipeline_executable_properties"


class Device(Owned):
    """An opened GPU: `profile` (what it is), `tuning` (how kernels are shaped for it),
    `compute` and `transfer` queues (the same queue when there is no DMA-only family).

    Objects created on the device register with it (`adopt`) and are closed, newest first,
    when the device closes; per-device helpers (kernel cache, staging) live in `service()`.

    capture_statistics: enable VK_KHR_pipeline_executable_properties so kernels record their
    compiler statistics (vkrt.pipeline.pipeline_statistics); capture_disassembly: that and the
    compiler's internal representations too (vkrt.pipeline.pipeline_representations: RADV's
    include the GCN assembly). queues=False opens the device for
    building pipelines only: `compute` and `transfer` are None and nothing can be submitted
    (Mesa's null RADV device, RADV_FORCE_FAMILY, has no queue that runs work and no memory).

    settings: the process's Settings (default: read from the environment now, once); the layers
    below and the model and engine built on this device take theirs from `device.settings`.
    `spec` (default: settings.device) picks the device; `vram_budget` (default:
    settings.vram_budget) caps VRAM use. `tuning_overrides`: settings.tune (VKRT_TUNE) parsed, the
    (field, value) pairs set in the tuning row; a TuningOverrideError naming VKRT_TUNE before
    anything is opened where they do not parse.
    """

    def __init__(self, spec: str | None = None, *, instance: Instance | None = None,
                 validate: bool | None = None, label: str | None = None, vram_budget: int | None = None,
                 capture_statistics: bool = False, capture_disassembly: bool = False, queues: bool = True,
                 settings: Settings | None = None):
        self.capture_statistics = capture_statistics or capture_disassembly
        self.capture_disassembly = capture_disassembly
        self._open_queues = queues
        self._owns_instance = instance is None
        if settings is None:
            settings = instance.settings if instance is not None else Settings.from_env()
        self.settings: Settings = settings
        self.tuning_overrides: tuple[tuple[str, object], ...] = parse_tune(settings.tune)
        self.instance = instance or Instance(validate=validate, settings=settings)
        self.handle = None
        try:
            self.profile: DeviceProfile = select_device(self.instance.profiles(),
                                                        settings.device if spec is None else spec)
            if self.capture_statistics and STATISTICS_EXTENSION not in self.profile.extensions:
                raise UnsupportedDevice(f"{self.profile.name} lacks {STATISTICS_EXTENSION}: it cannot report "
                                        "compiler statistics")
            self.tuning: Tuning = tuning_for(self.profile, settings.coopmat, self.tuning_overrides)
        except Exception:
            if self._owns_instance:
                self.instance.close()
            raise
        super().__init__(label or self.profile.name)
        self.physical = self.instance.physical_devices[self.profile.index]
        self._children: dict[int, weakref.ref] = {}
        self._serial = 0
        self._services: dict[str, Owned] = {}
        self.heap_used = [0] * len(self.profile.heaps)
        # bytes of DEVICE-kind buffers, and an optional cap on them (emulates a smaller card)
        self.vram_used = 0
        self.vram_budget = vram_budget if vram_budget is not None else settings.vram_budget
        self._create()
        log.info("opened %s (%s, %s, arch %s)", self.profile.name, self.profile.device_type,
                 self.profile.driver_info or self.profile.driver_name, self.profile.architecture.value)
        if self.tuning_overrides:
            log.info("tuning overrides: VKRT_TUNE=%r", describe_tune(self.tuning_overrides))

    def identity(self) -> dict:
        """The profile's identity (how bench reports name the device) and, where VKRT_TUNE or a
        script's --set changed the tuning, those changes as `tune`."""
        tune = describe_tune(self.tuning_overrides)
        return {**self.profile.identity(), **({"tune": tune} if tune else {})}

    def _create(self) -> None:
        p = self.profile
        compute = p.compute_family
        transfer = p.transfer_family
        families = [compute.index] + ([transfer.index] if transfer else [])
        queue_infos = [vk.VkDeviceQueueCreateInfo(queueFamilyIndex=f, queueCount=1, pQueuePriorities=[1.0])
                       for f in families]
        self.extensions = [e for e in OPTIONAL_EXTENSIONS if e in p.extensions]
        if p.api >= (1, 3) and "VK_EXT_subgroup_size_control" in self.extensions:
            self.extensions.remove("VK_EXT_subgroup_size_control")
        if self.capture_statistics:
            self.extensions.append(STATISTICS_EXTENSION)
        f11 = vk.VkPhysicalDeviceVulkan11Features(storageBuffer16BitAccess=p.storage_16bit,
                                                  uniformAndStorageBuffer16BitAccess=p.storage_16bit)
        coopmat = self.tuning.mm_coopmat or self.tuning.fa_coopmat
        if coopmat:
            self.extensions.append("VK_KHR_cooperative_matrix")
        chain = (vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(pNext=f11, cooperativeMatrix=True)
                 if coopmat else f11)
        f12 = vk.VkPhysicalDeviceVulkan12Features(
            pNext=chain, timelineSemaphore=True, vulkanMemoryModel=coopmat, shaderFloat16=p.fp16_math,
            shaderInt8=p.int8_math,
            storageBuffer8BitAccess=p.storage_8bit, uniformAndStorageBuffer8BitAccess=p.storage_8bit,
            storagePushConstant8=False)
        head = f12
        if p.api >= (1, 3):
            head = vk.VkPhysicalDeviceVulkan13Features(pNext=f12, subgroupSizeControl=p.subgroup_size_control,
                                                       computeFullSubgroups=p.subgroup_size_control)
        if self.capture_statistics:
            head = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(pNext=head, pipelineExecutableInfo=True)
        base = vk.VkPhysicalDeviceFeatures(shaderInt16=p.int16_math, shaderInt64=p.int64_math)
        feats = vk.VkPhysicalDeviceFeatures2(pNext=head, features=base)
        info = vk.VkDeviceCreateInfo(pNext=feats, queueCreateInfoCount=len(queue_infos),
                                     pQueueCreateInfos=queue_infos, enabledExtensionCount=len(self.extensions),
                                     ppEnabledExtensionNames=self.extensions)
        with vk_call(f"creating the logical device on {p.name}"):
            self.handle = vk.vkCreateDevice(self.physical, info, None)
        self.compute = self.transfer = None
        if self._open_queues:
            self.compute = Queue(self, compute.index, 0, "compute")
            self.transfer = Queue(self, transfer.index, 0, "transfer") if transfer else self.compute

    @property
    def vram_free(self) -> int:
        """Bytes of VRAM not yet taken by DEVICE-kind buffers, under the budget if one is set
        (else the largest device-local heap)."""
        total = self.vram_budget if self.vram_budget is not None else self.profile.vram
        return max(0, total - self.vram_used)

    @property
    def has_transfer_queue(self) -> bool:
        return self.transfer is not self.compute

    # -- ownership -------------------------------------------------------------------------

    def adopt(self, child: Owned) -> None:
        """Register `child` to be closed (newest first) when the device closes."""
        self._serial += 1
        self._children[self._serial] = weakref.ref(child)
        child._device_serial = self._serial

    def forget(self, child: Owned) -> None:
        self._children.pop(getattr(child, "_device_serial", None), None)

    def service(self, key: str, factory: Callable[["Device"], T]) -> T:
        """A per-device helper, created on first use and closed with the device."""
        svc = self._services.get(key)
        if svc is None:
            svc = self._services[key] = factory(self)
        return svc

    def check_validation(self) -> None:
        """Raise ValidationError if the validation layer reported errors (then forget them)."""
        errors = self.instance.validation_errors
        if errors:
            first, count = errors[0], len(errors)
            errors.clear()
            raise ValidationError(f"{count} Vulkan validation error(s); first: {first}")

    def wait_idle(self) -> None:
        if self.compute is None:  # no queues: nothing was submitted
            return
        with vk_call("waiting for the device to go idle"):
            vk.vkDeviceWaitIdle(self.handle)

    def _release(self) -> None:
        if self.handle is not None:
            try:
                self.wait_idle()
            except VkrtError:
                pass
            for serial in sorted(self._children, reverse=True):
                child = self._children.get(serial)
                child = child() if child is not None else None
                if child is not None:
                    child.close()
            self._children.clear()
            for svc in reversed(list(self._services.values())):
                svc.close()
            self._services.clear()
            if self.compute is not None:
                self.compute.close()
            if self.transfer is not self.compute:
                self.transfer.close()
            vk.vkDestroyDevice(self.handle, None)
            self.handle = None
        if self._owns_instance:
            self.instance.close()
