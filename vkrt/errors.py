"""Errors raised by vkrt. Each one says what was being done and with which sizes."""


class VkrtError(Exception):
    """Base class of every error vkrt raises on purpose."""


class VulkanUnavailable(VkrtError):
    """No Vulkan loader, or no Vulkan device, on this machine."""


class ConfigError(VkrtError, ValueError):
    """A setting (environment variable or option) has a value vkrt cannot use."""


class TuningOverrideError(ConfigError):
    """A tuning override (VKRT_TUNE, a bench script's --set) names no tuning field, has a value
    that does not parse, or asks for one the device cannot hold."""


class OutOfRange(VkrtError, ValueError):
    """A byte range does not fit inside the buffer or range it refers to."""


class GGMLTypeError(VkrtError, ValueError):
    """An unknown GGML type, or a shape that does not fit the type's block size."""


class GGUFError(VkrtError, ValueError):
    """A GGUF file is unreadable, inconsistent, or lacks what the model needs; names the file."""


class HubError(VkrtError):
    """A Hugging Face repository, quant tag or file (`-hf`) cannot be found, listed or downloaded."""


class DeviceNotFound(VkrtError):
    """VKRT_DEVICE (or a requested device) matches no physical device."""


class UnsupportedDevice(VkrtError):
    """The device lacks something vkrt cannot work without (e.g. Vulkan 1.2)."""


class VulkanError(VkrtError):
    """A Vulkan call failed; the message names the call and what it was for."""

    def __init__(self, message: str, result: str | None = None):
        super().__init__(message)
        self.result = result


class DeviceLost(VulkanError):
    """VK_ERROR_DEVICE_LOST: the GPU stopped executing our work."""


class GpuTimeout(VulkanError):
    """Waiting for the GPU took longer than the configured timeout."""


class OutOfDeviceMemory(VulkanError, MemoryError):
    """An allocation failed; the message gives requested bytes, heap, and what is in use."""


class BufferTooLarge(VkrtError, ValueError):
    """One buffer would exceed the device's maximum buffer size (maxBufferSize)."""


class HostImportError(VkrtError):
    """Registering, looking up or using imported host memory failed (e.g. after unregister)."""


class ShaderCompileError(VkrtError):
    """glslang rejected a shader. `errors` holds (file, line, message) tuples."""

    def __init__(self, name: str, log: str, errors: list[tuple[str, int, str]]):
        first = errors[0] if errors else None
        where = f"{first[0]}:{first[1]}: {first[2]}" if first else log.strip()
        super().__init__(f"compiling {name} failed: {where}\n{log.strip()}")
        self.name = name
        self.log = log
        self.errors = errors

    @property
    def line(self) -> int | None:
        return self.errors[0][1] if self.errors else None


class KernelInterfaceError(VkrtError):
    """The Python description of a kernel disagrees with the compiled shader."""


class ValidationError(VkrtError):
    """The Vulkan validation layer reported an error."""


class UnsupportedShape(VkrtError, ValueError):
    """An op was given a shape, type or layout it does not handle; the message says what it does."""
