"""GLSL -> SPIR-V, reflection, push-constant layouts, kernels (compute pipelines), their
compiler statistics."""

from .compiler import compile_shader
from .kernel import Kernel, kernel
from .push_constants import PushConstants
from .statistics import pipeline_representations, pipeline_statistics

__all__ = ["Kernel", "PushConstants", "compile_shader", "kernel", "pipeline_representations", "pipeline_statistics"]
