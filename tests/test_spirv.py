"""SPIR-V reflection: what the kernel checks rely on."""

from vkrt.pipeline.compiler import compile_shader
from vkrt.pipeline.spirv import reflect

SRC = """#version 450
layout(local_size_x = 64, local_size_y = 2) in;
layout(constant_id = 3) const float SCALE = 1.0;
layout(constant_id = 4) const bool FLAG = false;
shared float tile[32][33];
layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer Y { uint y[]; };
layout(binding = 2) writeonly buffer Z { uint z[]; };
layout(push_constant) uniform P { uint a; float b; uvec4 ne; uint arr[3]; } p;
void main() {
    tile[gl_LocalInvocationID.x % 32][0] = SCALE;
    barrier();
    x[0] = tile[1][0] + float(y[0]) + p.b + float(FLAG) + float(p.ne.x + p.arr[2]);
    z[0] = p.a;
}
"""


def test_reflection(spirv_cache):
    iface = reflect(compile_shader("reflect_me", source=SRC))
    assert iface.push_size == 44
    assert [(m.name, m.offset, m.size) for m in iface.push_members] == [
        ("a", 0, 4), ("b", 4, 4), ("ne", 16, 16), ("arr", 32, 12)]
    assert iface.bindings[0].readonly is False and iface.bindings[0].writeonly is False
    assert iface.bindings[1].readonly is True
    assert iface.bindings[2].writeonly is True
    assert iface.spec_constants == {3: "float", 4: "bool"}
    assert iface.local_size == (64, 2, 1)
    assert iface.shared_bytes == 32 * 33 * 4


def test_local_size_id(spirv_cache):
    iface = reflect(compile_shader("binary", {"OP": 0}))
    assert iface.local_size_spec_ids[0] == 0
    assert sorted(iface.bindings) == [0, 1, 2]
