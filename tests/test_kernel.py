"""Kernels: the Python description is checked against the shader before a pipeline exists."""

import numpy as np
import pytest

from vkrt.commands import CommandSequence, download, run_once
from vkrt.errors import KernelInterfaceError
from vkrt.memory import Buffer
from vkrt.ops.grid import groups_for
from vkrt.pipeline import Kernel, PushConstants, kernel

SRC = """#version 450
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BIAS = 0;
layout(binding = 0) writeonly buffer O { uint o[]; };
layout(push_constant) uniform P { uint n; uint mul; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) o[i] = i * p.mul + BIAS;
}
"""
PUSH = PushConstants(("n", "u32"), ("mul", "u32"))


def test_kernel_runs_with_spec_constants_and_workgroup(device):
    k = Kernel(device, "spec_test", source=SRC, push=PUSH, spec={1: 5}, workgroup=(32,))
    try:
        assert k.workgroup == (32, 1, 1)
        out = Buffer(device, 4 * 100)
        seq = CommandSequence(device)
        with seq.record():
            seq.dispatch(k, [out], push={"n": 100, "mul": 3}, groups=groups_for(k, 100))
        seq.run()
        np.testing.assert_array_equal(download(device, out, np.uint32), np.arange(100) * 3 + 5)
        seq.close()
        out.close()
    finally:
        k.close()


@pytest.mark.parametrize("layout, message", [
    (PushConstants(("n", "u32")), "disagrees"),
    (PushConstants(("n", "u32"), ("mul", "f32"), ("extra", "u32")), "disagrees"),
    (PushConstants(("mul", "u32"), ("n", "u32")), "disagrees"),
    (None, "no Python layout"),
])
def test_push_constant_mismatch_is_caught(device, layout, message):
    with pytest.raises(KernelInterfaceError, match=message):
        Kernel(device, "spec_test", source=SRC, push=layout)


def test_unknown_spec_constant(device):
    with pytest.raises(KernelInterfaceError, match="specialisation constant"):
        Kernel(device, "spec_test", source=SRC, push=PUSH, spec={7: 1})


def test_fixed_local_size_cannot_be_changed(device):
    src = "#version 450\nlayout(local_size_x = 16) in;\nlayout(binding = 0) buffer O { uint o[]; };\n" \
          "void main() { o[0] = 1; }\n"
    with pytest.raises(KernelInterfaceError, match="fixed at 16"):
        Kernel(device, "fixed", source=src, workgroup=(64,))


def test_too_much_shared_memory(device):
    words = device.profile.shared_memory // 4 + 1
    src = f"#version 450\nlayout(local_size_x = 1) in;\nshared uint big[{words}];\n" \
          "layout(binding = 0) buffer O { uint o[]; };\nvoid main() { big[0] = 1; barrier(); o[0] = big[0]; }\n"
    with pytest.raises(KernelInterfaceError, match="shared memory"):
        Kernel(device, "big_shared", source=src)


def test_grid_set_is_the_only_other_set(device):
    """Set 1 is the IQ grids' buffer (pipeline/quant_tables.py), bound by the dispatch: a shader
    that reads it gets its words; any other binding outside set 0 is refused by name."""
    from vkrt.pipeline.quant_tables import grid_words
    grids = "layout(set = 1, binding = 0) readonly buffer QTables { uvec4 qtables[]; };\n"
    src = "#version 450\nlayout(local_size_x = 4) in;\nlayout(binding = 0) writeonly buffer O { uvec4 o[]; };\n" \
          + grids + "void main() { o[gl_LocalInvocationID.x] = qtables[gl_LocalInvocationID.x + 3u]; }\n"
    k = Kernel(device, "grids_read", source=src)
    out = Buffer(device, 64)
    try:
        run_once(device, lambda seq: seq.dispatch(k, [out]))
        np.testing.assert_array_equal(download(device, out, np.uint32), grid_words()[0][12:28])
    finally:
        out.close()
        k.close()
    for bad in (grids.replace("QTables", "Other"), grids.replace("set = 1", "set = 2")):
        src = "#version 450\nlayout(local_size_x = 1) in;\nlayout(binding = 0) buffer O { uvec4 o[]; };\n" \
              + bad.replace("qtables", "t") + "void main() { o[0] = t[0]; }\n"
        with pytest.raises(KernelInterfaceError, match="outside set 0"):
            Kernel(device, "grids_bad", source=src)


def test_push_constant_pack_errors():
    with pytest.raises(KernelInterfaceError, match="has no value"):
        PUSH.pack(n=1)
    with pytest.raises(KernelInterfaceError, match="unknown"):
        PUSH.pack(n=1, mul=2, bogus=3)
    with pytest.raises(KernelInterfaceError, match="at most 128"):
        PushConstants(*[(f"f{i}", "u32") for i in range(33)])
    layout = PushConstants(("a", "u32"), ("ne", "uvec4"), ("s", "f32[2]"))
    assert layout.size == 40
    assert len(layout.pack(a=1, ne=(1, 2, 3, 4), s=(0.5, 1.5))) == 40


def test_kernel_cache_returns_the_same_pipeline(device):
    from vkrt.ops.elementwise import BINARY_PUSH
    a = kernel(device, "binary", defines={"OP": 0}, push=BINARY_PUSH, workgroup=(device.tuning.wg_size,))
    b = kernel(device, "binary", defines={"OP": 0}, push=BINARY_PUSH, workgroup=(device.tuning.wg_size,))
    c = kernel(device, "binary", defines={"OP": 1}, push=BINARY_PUSH, workgroup=(device.tuning.wg_size,))
    assert a is b and c is not a
