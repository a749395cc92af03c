"""Instance: the VkInstance, optional validation, and the physical devices it sees."""

from __future__ import annotations

import logging
import threading

from ..errors import VulkanUnavailable
from ..owned import Owned
from ..settings import Settings
from .architecture import Arch, parse_arch
from .profile import DeviceProfile, query_profile
from .vk import INSTALL_HINT, ffi, vk, vk_call

log = logging.getLogger("vkrt.vulkan")

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
API_VERSION = vk.VK_MAKE_VERSION(1, 3, 0)  # the highest we use; devices may be 1.2

# The binding routes every debug callback through one module global; pUserData says which
# instance a message belongs to.
_validating: dict[int, "Instance"] = {}
_validating_lock = threading.Lock()


def _debug_callback(severity, types, data, user_data):
    message = ffi.string(data.pMessage).decode("utf-8", "replace") if data.pMessage else ""
    if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT:
        log.error("%s", message)
        key = int(ffi.cast("uintptr_t", user_data)) if user_data else 0
        with _validating_lock:
            inst = _validating.get(key)
        if inst is not None:
            inst.validation_errors.append(message)
    elif severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT:
        log.warning("%s", message)
    else:
        log.debug("%s", message)
    return vk.VK_FALSE


class Instance(Owned):
    """A VkInstance. With validation on (`validate`, default: settings.validate, VKRT_VALIDATE)
    and the layer installed it enables the Khronos validation layer and routes its messages to
    the `vkrt.vulkan` logger; errors are also kept in `validation_errors` so tests can fail on
    them. `settings` (default: the environment's) also give the architecture override the
    profiles carry (`arch_override`, settings.arch parsed: a ConfigError naming VKRT_ARCH before
    anything is created where it is not an architecture)."""

    def __init__(self, validate: bool | None = None, label: str = "instance", *, settings: Settings | None = None):
        settings = Settings.from_env() if settings is None else settings
        arch_override = parse_arch(settings.arch) if settings.arch else None
        super().__init__(label)
        self.settings = settings
        self.arch_override: Arch | None = arch_override
        self.handle = None
        self._messenger = None
        self.validation_errors: list[str] = []
        want = settings.validate if validate is None else validate
        with vk_call("enumerating Vulkan instance layers"):
            layers = {layer.layerName for layer in vk.vkEnumerateInstanceLayerProperties()}
            instance_exts = {e.extensionName for e in vk.vkEnumerateInstanceExtensionProperties(None)}
        self.validating = want and VALIDATION_LAYER in layers and "VK_EXT_debug_utils" in instance_exts
        if want and not self.validating:
            log.warning("VKRT_VALIDATE is set but %s is not installed (Debian: vulkan-validationlayers)",
                        VALIDATION_LAYER)
        app = vk.VkApplicationInfo(pApplicationName="vkrt", applicationVersion=1, pEngineName="vkrt",
                                   engineVersion=1, apiVersion=API_VERSION)
        enabled_layers = [VALIDATION_LAYER] if self.validating else []
        enabled_exts = ["VK_EXT_debug_utils"] if self.validating else []
        info = vk.VkInstanceCreateInfo(pApplicationInfo=app, enabledLayerCount=len(enabled_layers),
                                       ppEnabledLayerNames=enabled_layers,
                                       enabledExtensionCount=len(enabled_exts),
                                       ppEnabledExtensionNames=enabled_exts)
        try:
            self.handle = vk.vkCreateInstance(info, None)
        except vk.VkErrorIncompatibleDriver:
            self._closed = True
            raise VulkanUnavailable(f"no Vulkan driver (ICD) is installed; {INSTALL_HINT}") from None
        except (vk.VkError, vk.VkException) as exc:
            self.close()
            raise VulkanUnavailable(f"vkCreateInstance failed ({type(exc).__name__}); {INSTALL_HINT}") from None
        if self.validating:
            self._install_messenger()
        with vk_call("enumerating physical devices"):
            self.physical_devices = list(vk.vkEnumeratePhysicalDevices(self.handle))
        self._profiles: list[DeviceProfile] | None = None

    def _install_messenger(self) -> None:
        vk._internal_vkDebugUtilsMessengerCallbackEXT = _debug_callback
        sev = (vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT)
        kinds = (vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                 | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT)
        self._key = id(self)
        info = vk.VkDebugUtilsMessengerCreateInfoEXT(messageSeverity=sev, messageType=kinds,
                                                     pfnUserCallback=_debug_callback,
                                                     pUserData=ffi.cast("void *", self._key))
        create = vk.vkGetInstanceProcAddr(self.handle, "vkCreateDebugUtilsMessengerEXT")
        with vk_call("creating the debug messenger"):
            self._messenger = create(self.handle, info, None)
        with _validating_lock:
            _validating[self._key] = self

    def profiles(self) -> list[DeviceProfile]:
        """A DeviceProfile for every physical device, in enumeration order."""
        if self._profiles is None:
            self._profiles = [query_profile(pd, i, self.arch_override, self.handle) for i, pd in enumerate(self.physical_devices)]
        return self._profiles

    def _release(self) -> None:
        with _validating_lock:
            _validating.pop(getattr(self, "_key", None), None)
        if self._messenger is not None:
            destroy = vk.vkGetInstanceProcAddr(self.handle, "vkDestroyDebugUtilsMessengerEXT")
            destroy(self.handle, self._messenger, None)
            self._messenger = None
        if self.handle is not None:
            vk.vkDestroyInstance(self.handle, None)
            self.handle = None
