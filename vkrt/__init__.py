"""vkrt: a Vulkan compute runtime in Python for GGUF language models."""

__version__ = "0.1.0"
