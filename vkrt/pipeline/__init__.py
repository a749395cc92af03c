"""GLSL -> SPIR-V, reflection, push-constant layouts, kernels (compute pipelines)."""

from .compiler import compile_shader
from .kernel import Kernel, kernel
from .push_constants import PushConstants

__all__ = ["Kernel", "PushConstants", "compile_shader", "kernel"]
