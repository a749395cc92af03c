"""GPU dequantisation equals gguf.quants.dequantize bit for bit, for every supported type."""

import dataclasses
import re

import numpy as np
import pytest
from quant_data import ALL, assert_same_bits, flushed_elements, random_blocks, reference, weight_tensor

from vkrt.commands import CommandSequence, read_tensor
from vkrt.errors import GGMLTypeError
from vkrt.memory import Tensor, ggml_type
from vkrt.ops.dequant import dequantize
from vkrt.ops.mat_vec import MV_UNITS
from vkrt.ops.quant import TABLE_TYPES, block_align, exact_defines, supported_types, type_defines
from vkrt.pipeline.compiler import compile_shader, shader_dir


def run_dequant(device, w: Tensor, ne, **kw) -> np.ndarray:
    out = Tensor.empty(device, "F32", ne, name="dequantised")
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                dequantize(seq, w, out, **kw)
            seq.run()
        return read_tensor(out)
    finally:
        out.close()


def test_supported_types_are_the_twenty_five():
    """Plain, legacy, K-quants, the IQ quants, MXFP4 and the TQ types: each in the tests' ALL."""
    assert len(ALL) == 25 and sorted(t.name for t in supported_types()) == sorted(ALL)


@pytest.mark.parametrize("name", ALL)
def test_includes_match_the_type_table(name):
    """Each type is described once: its include's block constants agree with the table, and
    types.glsl selects it by the define the ops pass."""
    t = ggml_type(name)
    path = shader_dir() / t.glsl
    text = path.read_text()
    for inc in re.findall(r'^#include "(plain\.glsl|units32\.glsl)"', text, re.M):  # constants types share
        text += (path.parent / inc).read_text()
    consts = {k: int(v) for k, v in re.findall(r"^#define (QK|QTS|QR|QALIGN|QU) (\d+)", text, re.M)}
    if t.quantized:
        assert (consts["QK"], consts["QTS"]) == (t.block_size, t.type_size)
        # the mat-vec's lanes a row count its units: the host's table agrees with the include
        assert MV_UNITS[name] == consts.get("QU", consts["QK"] // consts["QR"])
    else:
        assert consts["QTS"] == consts["QK"] * t.type_size
    assert consts["QK"] % consts["QR"] == 0 and consts["QR"] % 4 == 0
    assert consts["QALIGN"] == block_align(t)
    assert ("#define IQ_GRID" in text) == (name in TABLE_TYPES)   # the types quant_tables_shared affects
    types = (shader_dir() / "quant" / "types.glsl").read_text()
    assert f'defined(QTYPE_{name})\n#include "{t.glsl.split("/")[-1]}"' in types


def _execution_modes(spirv: bytes) -> list[tuple[int, ...]]:
    words = np.frombuffer(spirv, np.uint32)
    modes, i = [], 5
    while i < len(words):
        op, n = int(words[i] & 0xFFFF), int(words[i] >> 16)
        if op == 16:   # OpExecutionMode: entry point, mode, literals
            modes.append(tuple(int(w) for w in words[i + 2:i + n]))
        i += n
    return modes


@pytest.mark.parametrize("shader", ["dequant", "get_rows"])
def test_exact_kernels_keep_subnormals_where_the_device_can(device, shader):
    """MXFP4's scales 2^-128 and 2^-127 are fp32 subnormals, which NVIDIA flushes by default:
    the exact kernels ask for DenormPreserve (32-bit) exactly when the device offers it."""
    defines = exact_defines(ggml_type("MXFP4"), device)
    assert ("DENORM_PRESERVE" in defines) == device.profile.denorm_preserve_fp32
    modes = _execution_modes(compile_shader(shader, {**defines, "DENORM_PRESERVE": 1}))
    assert (4459, 32) in modes   # DenormPreserve, width 32
    assert (4459, 32) not in _execution_modes(compile_shader(shader, type_defines(ggml_type("MXFP4"), device.tuning)))


@pytest.mark.parametrize("name", ALL)
def test_bit_exact(device, name):
    rng = np.random.default_rng(sum(map(ord, name)))
    t = ggml_type(name)
    k = 3 * t.block_size if t.quantized else 37    # plain types: a row length not a multiple of 4
    raw = random_blocks(name, 2 * 5, k, rng)
    w = weight_tensor(device, name, raw, (k, 5, 2))
    try:
        got = run_dequant(device, w, (k, 5, 2))
    finally:
        w.close()
    assert_same_bits(got, reference(name, raw).reshape(2, 5, k), flushed_elements(name, raw, device))


@pytest.mark.parametrize("shared", [False, True])
def test_tables_shared_or_constant(device, monkeypatch, shared):
    """The IQ grids and signs read from the constant arrays (GCN) or from shared copies (NVIDIA,
    lavapipe): the same bits either way. IQ3_XXS, the smallest grid: lavapipe builds
    the constant path slowly (IQ2_XXS 18 s, IQ1_M's 2048 entries 450 s)."""
    name = "IQ3_XXS"
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, quant_tables_shared=shared))
    assert ("QTABLES_SHARED" in type_defines(ggml_type(name), device.tuning)) == shared
    rng = np.random.default_rng(17)
    raw = random_blocks(name, 3, 512, rng)
    w = weight_tensor(device, name, raw, (512, 3))
    try:
        got = run_dequant(device, w, (512, 3))
    finally:
        w.close()
    assert_same_bits(got, reference(name, raw))


def test_f16_every_finite_pattern(device):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]          # NaN and Inf excluded
    bits = bits[: len(bits) // 64 * 64].reshape(-1, 64)
    raw = bits.view(np.uint8)
    w = weight_tensor(device, "F16", raw, (64, bits.shape[0]))
    try:
        got = run_dequant(device, w, (64, bits.shape[0]))
    finally:
        w.close()
    assert_same_bits(got, reference("F16", raw))


@pytest.mark.parametrize("name", ["Q4_0", "Q6_K", "BF16"])
def test_strided_source(device, name):
    """A view whose rows are not evenly spaced (a row slice of a 3-D tensor) into a destination
    at an offset: done plane by plane."""
    rng = np.random.default_rng(7)
    t = ggml_type(name)
    k = t.block_size * 2 if t.quantized else 12
    raw = random_blocks(name, 6 * 3, k, rng)
    w = weight_tensor(device, name, raw, (k, 6, 3))
    try:
        view = w.slice(1, 1, 5)                      # ne (k, 4, 3), nb[2] != 4 * nb[1]
        got = run_dequant(device, view, (k, 4, 3))
    finally:
        w.close()
    assert_same_bits(got, reference(name, raw).reshape(3, 6, k)[:, 1:5])


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "F16"])
def test_row_ranges_when_larger_than_a_binding(device, name):
    """With a binding limit of a few rows the tensor is done in many dispatches, same bits."""
    rng = np.random.default_rng(3)
    t = ggml_type(name)
    k = t.block_size * 2 if t.quantized else 40
    raw = random_blocks(name, 37, k, rng)
    w = weight_tensor(device, name, raw, (k, 37))
    try:
        got = run_dequant(device, w, (k, 37), max_binding=4 * k * 4 + 64)
    finally:
        w.close()
    assert_same_bits(got, reference(name, raw))


def test_unsupported_type_is_named(device):
    w = Tensor.empty(device, "Q8_K", (256, 2))
    out = Tensor.empty(device, "F32", (256, 2))
    try:
        with CommandSequence(device) as seq, pytest.raises(GGMLTypeError, match=r"Q8_K.*Q4_K.*IQ2_XXS.*MXFP4"):
            with seq.record():
                dequantize(seq, w, out)
    finally:
        w.close()
        out.close()
