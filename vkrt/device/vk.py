"""The `vulkan` cffi binding, imported once, with Vulkan failures turned into vkrt errors."""

from __future__ import annotations

import contextlib
import re

from ..errors import DeviceLost, GpuTimeout, OutOfDeviceMemory, VulkanError, VulkanUnavailable

INSTALL_HINT = (
    "install a Vulkan loader and driver, e.g. on Debian/Ubuntu: "
    "apt-get install -y libvulkan1 mesa-vulkan-drivers (Mesa lavapipe runs on any CPU)"
)

try:
    import vulkan as vk  # noqa: F401  (re-exported)
    from vulkan import ffi, lib  # noqa: F401
except OSError as exc:  # the binding dlopens libvulkan.so.1 at import time
    raise VulkanUnavailable(f"no Vulkan loader (libvulkan.so.1) found: {exc}; {INSTALL_HINT}") from None
except ImportError as exc:
    raise VulkanUnavailable(f"the `vulkan` Python package is missing ({exc}); pip install vulkan") from None


# The binding's table of result codes lacks some, and gives VK_ERROR_OUT_OF_POOL_MEMORY a positive
# value; these are the codes as the Vulkan headers define them.
VK_ERROR_OUT_OF_POOL_MEMORY = -1000069000
_EXTRA_RESULTS = {VK_ERROR_OUT_OF_POOL_MEMORY: "VK_ERROR_OUT_OF_POOL_MEMORY",
                  -1000072003: "VK_ERROR_INVALID_EXTERNAL_HANDLE", -1000161000: "VK_ERROR_FRAGMENTATION",
                  -1000257000: "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS"}


def result_error(what: str, result: int) -> VulkanError:
    """The vkrt error for a VkResult returned by a direct `lib` call."""
    cls = vk.exception_codes.get(result)
    if cls is not None:
        return vk_error(what, cls())
    name = _EXTRA_RESULTS.get(result, f"VkResult {result}")
    return VulkanError(f"{what} failed: {name}", name)


class _Structs(list):
    """Structs of one cffi array, which it keeps alive: an item of a cffi array is a reference into
    the array's memory and does not (freed, its memory went to the next allocation of that size)."""

    def __init__(self, array, count: int):
        super().__init__(array[i] for i in range(count))
        self.array = array


def enumerate_structs(fn, args: tuple, ctype: str, stype: int, what: str) -> list:
    """The two-call enumeration fn(*args, count, out) of `ctype` structs, with sType set in every
    output struct; a failing VkResult raises result_error(what). The list keeps the structs'
    memory alive: hold it (not only its items) while they are read."""
    count = ffi.new("uint32_t*")
    result = fn(*args, count, ffi.NULL)
    if result != vk.VK_SUCCESS:
        raise result_error(what, result)
    out = ffi.new(f"{ctype}[]", count[0])
    for item in out:
        item.sType = stype
    result = fn(*args, count, out)
    if result != vk.VK_SUCCESS:
        raise result_error(what, result)
    return _Structs(out, count[0])


def result_name(exc: BaseException) -> str:
    # VkErrorOutOfDeviceMemory -> VK_ERROR_OUT_OF_DEVICE_MEMORY
    return "VK_" + re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__[2:]).upper()


@contextlib.contextmanager
def vk_call(what: str):
    """Re-raise errors of the Vulkan calls inside the block as vkrt errors naming `what`."""
    try:
        yield
    except (vk.VkError, vk.VkException) as exc:
        raise vk_error(what, exc) from None


def vk_error(what: str, exc: BaseException) -> VulkanError:
    name = result_name(exc)
    message = f"{what} failed: {name}"
    if isinstance(exc, vk.VkErrorDeviceLost):
        return DeviceLost(message + " (the GPU stopped executing; the device must be reopened)", name)
    if isinstance(exc, vk.VkTimeout):
        return GpuTimeout(message, name)
    if isinstance(exc, (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory)):
        return OutOfDeviceMemory(message, name)
    return VulkanError(message, name)


def cstr(value) -> str:
    """A char[] field of a cffi struct as a Python string."""
    if isinstance(value, str):
        return value
    return ffi.string(value).decode("utf-8", "replace")


def version_str(packed: int) -> str:
    return f"{packed >> 22}.{(packed >> 12) & 0x3FF}.{packed & 0xFFF}"
