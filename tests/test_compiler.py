"""In-process GLSL -> SPIR-V: success, errors with file and line, includes, defines, the cache."""

import struct

import pytest

from vkrt.errors import ShaderCompileError
from vkrt.pipeline.compiler import CompileStats, compile_shader
from vkrt.pipeline.spirv import MAGIC

OK = """#version 450
layout(local_size_x = 8) in;
layout(binding = 0) buffer O { uint o[]; };
void main() { o[gl_GlobalInvocationID.x] = VALUE; }
"""


def test_compiles_to_spirv(spirv_cache):
    spirv = compile_shader("ok", {"VALUE": 7}, source=OK)
    assert len(spirv) % 4 == 0
    assert struct.unpack("<I", spirv[:4])[0] == MAGIC


def test_shipped_shaders_compile(spirv_cache):
    for name in ("fill", "rope", "rms_norm"):
        assert struct.unpack("<I", compile_shader(name)[:4])[0] == MAGIC


def test_error_names_line(spirv_cache):
    bad = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n    undefined_thing = 1;\n}\n"
    with pytest.raises(ShaderCompileError) as info:
        compile_shader("bad_kernel", source=bad)
    err = info.value
    assert err.line == 4
    assert err.errors[0][0] == "bad_kernel"
    assert "undefined_thing" in str(err) and "bad_kernel:4" in str(err)


def test_error_inside_an_include_names_the_include(spirv_cache, tmp_path):
    inc = tmp_path / "broken.glsl"
    inc.write_text("float helper() {\n    return missing_value;\n}\n")
    src = f'#version 450\n#include "{inc}"\nlayout(local_size_x = 1) in;\nvoid main() {{}}\n'
    with pytest.raises(ShaderCompileError) as info:
        compile_shader("uses_include", source=src)
    assert info.value.errors[0][0].endswith("broken.glsl")
    assert info.value.line == 2


def test_missing_include_is_an_error(spirv_cache):
    src = '#version 450\n#include "no_such_file.glsl"\nlayout(local_size_x = 1) in;\nvoid main() {}\n'
    with pytest.raises(ShaderCompileError, match="no_such_file.glsl"):
        compile_shader("missing_include", source=src)


def test_define_missing_is_an_error(spirv_cache):
    with pytest.raises(ShaderCompileError, match="VALUE"):
        compile_shader("ok", source=OK)


def test_cache_hit_on_second_compile(spirv_cache):
    hits, misses = CompileStats.hits, CompileStats.misses
    a = compile_shader("ok", {"VALUE": 1}, source=OK, cache_dir=spirv_cache)
    assert (CompileStats.hits, CompileStats.misses) == (hits, misses + 1)
    b = compile_shader("ok", {"VALUE": 1}, source=OK, cache_dir=spirv_cache)
    assert (CompileStats.hits, CompileStats.misses) == (hits + 1, misses + 1)
    assert a == b
    assert len(list(spirv_cache.glob("*.spv"))) == 1
    compile_shader("ok", {"VALUE": 2}, source=OK, cache_dir=spirv_cache)  # other defines: another entry
    assert CompileStats.misses == misses + 2
    compile_shader("ok", {"VALUE": 1}, source=OK)  # no cache folder (VKRT_SHADER_CACHE=0): compiled again
    assert CompileStats.misses == misses + 3


def test_cache_key_covers_includes(spirv_cache, tmp_path):
    inc = tmp_path / "value.glsl"
    src = f'#version 450\n#include "{inc}"\nlayout(local_size_x = 1) in;\n' \
          'layout(binding = 0) buffer O { uint o[]; };\nvoid main() { o[0] = V; }\n'
    inc.write_text("#define V 1\n")
    first = compile_shader("inc_key", source=src, cache_dir=spirv_cache)
    misses = CompileStats.misses
    inc.write_text("#define V 2\n")
    second = compile_shader("inc_key", source=src, cache_dir=spirv_cache)
    assert CompileStats.misses == misses + 1
    assert first != second


# shuffles whose offsets stay run-time values, and why (common.glsl's XOR_SUM says what literals buy)
RUNTIME_OFFSETS = {
    ("flash_attn_cm.comp", "w"): "cooperative-matrix devices only (no RX 580 runs it)",
    ("subgroup.glsl", "o"): "sg_shuffle_xor itself: its callers pass the offsets",
    ("mv_reduce.glsl", "o"): "MV_XOR_LEVEL and MV_SC_LEVEL, macros spelled out with literals",
    ("flash_attn.comp", "o"): "SC_DOWN and SC_UP (dot_sums), macros spelled out with literals",
    ("flash_attn_loop.glsl", "o"): "XOR_STEP_ALL_, the butterfly a level at a time, a macro spelled out with literals",
}


def _call_args(text: str, open_paren: int) -> list[str]:
    """The comma-separated arguments of the call whose '(' is at text[open_paren]."""
    depth, args, start = 0, [], open_paren + 1
    for i in range(open_paren, len(text)):
        if text[i] in "([":
            depth += 1
        elif text[i] in ")]":
            depth -= 1
            if depth == 0:
                return [*args, text[start:i].strip()]
        elif text[i] == "," and depth == 1:
            args.append(text[start:i].strip())
            start = i + 1
    raise AssertionError(f"unbalanced call at {text[open_paren:open_paren + 40]!r}")


def test_butterfly_shuffles_take_literal_offsets():
    """Every xor shuffle in shaders/ has a literal offset (else it is listed above): Mesa 22's RX 580
    compiler makes a run-time offset a ds_bpermute, a literal one DPP or a swizzle."""
    import re
    from pathlib import Path

    call = re.compile(r"(?<!float )\b(?:subgroupShuffleXor|sg_shuffle_xor)\(")
    found = set()
    for path in sorted((Path(__file__).resolve().parents[1] / "shaders").glob("*.*")):
        text = path.read_text()
        for m in call.finditer(text):
            offset = _call_args(text, m.end() - 1)[-1]
            if not re.fullmatch(r"\d+u?", offset):
                found.add((path.name, offset))
    assert found == set(RUNTIME_OFFSETS), found ^ set(RUNTIME_OFFSETS)
