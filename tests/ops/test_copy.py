"""copy/convert against numpy: type pairs, odd shapes, strided views and offsets on both sides,
16-bit storage and its word fallback, splitting over bindings, a tensor larger than 128 MiB."""

import dataclasses
import struct

import numpy as np
import pytest

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.errors import GGMLTypeError, OutOfRange
from vkrt.memory import BF16, F16, F32, I32, Tensor
from vkrt.ops.copy import copy
from vkrt.ops.split import binding_pieces
from vkrt.pipeline import compile_shader

PAIRS = [(F32, F32), (F32, F16), (F16, F32), (F16, F16), (BF16, F32), (BF16, F16), (I32, I32)]
SHAPES = [(1,), (31,), (33, 31), (2, 3, 33, 1), (1001, 3), (1, 2, 1, 1031)]



def random_values(typ, shape, rng) -> np.ndarray:
    """Host values of `typ` (BF16 as its uint16 bit patterns)."""
    if typ == I32:
        return rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)
    x = (rng.standard_normal(shape) * 100).astype(np.float32)
    if typ == BF16:
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(typ.dtype)


def reference(x: np.ndarray, src, dst) -> np.ndarray:
    """numpy's conversion of host values of `src` to `dst` (round to nearest even)."""
    if src == dst:
        return x
    if src == BF16:
        x = (x.astype(np.uint32) << 16).view(np.float32)
    with np.errstate(over="ignore"):  # beyond the f16 range is inf, as on the GPU
        return x.astype(dst.dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def upload(device, x, typ):
    return tensor_from_numpy(device, x, typ=typ)


@pytest.mark.parametrize("src_t, dst_t", PAIRS, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_contiguous_copy_and_convert(device, src_t, dst_t, shape):
    rng = np.random.default_rng(len(shape) * 1000 + shape[-1])
    x = random_values(src_t, shape, rng)
    src = upload(device, x, src_t)
    dst = Tensor.empty(device, dst_t, tuple(reversed(shape)))
    try:
        run_once(device, lambda seq: copy(seq, src, dst))
        assert same_bits(read_tensor(dst), reference(x, src_t, dst_t))
    finally:
        src.close()
        dst.close()


@pytest.mark.parametrize("src_t, dst_t", [(F32, F16), (F16, F32), (F16, F16), (BF16, F32), (F32, F32)],
                         ids=lambda t: t.name)
def test_strided_views_and_offsets(device, src_t, dst_t):
    """src: a permuted, sliced view at an odd element offset; dst: a strided slice of a larger
    tensor whose other elements must stay as they were."""
    rng = np.random.default_rng(7)
    x = random_values(src_t, (3, 5, 33, 37), rng)                    # ne = (37, 33, 5, 3)
    big = upload(device, x, src_t)
    src = big.slice(0, 1, 32).slice(2, 1, 4).permute(1, 0, 3, 2)   # ne (33, 31, 3, 3), odd offset
    want = reference(x[:, 1:4, :, 1:32].transpose(1, 0, 3, 2), src_t, dst_t)  # numpy (3, 3, 31, 33)
    fill = random_values(dst_t, (4, 3, 40, 35), rng)
    outer = upload(device, fill, dst_t)                              # ne = (35, 40, 3, 4)
    dst = outer.slice(0, 1, 34).slice(1, 9, 40).slice(3, 1, 4)       # ne (33, 31, 3, 3)
    try:
        assert src.ne == dst.ne == (33, 31, 3, 3) and not src.is_contiguous() and not dst.is_contiguous()
        run_once(device, lambda seq: copy(seq, src, dst))
        got = read_tensor(outer)
        expect = fill.copy()
        expect[1:4, :, 9:40, 1:34] = want
        assert same_bits(got, expect)
    finally:
        big.close()
        outer.close()


def test_transposed_source_and_broadcast(device):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((33, 1000)).astype(np.float32)
    src = upload(device, x, F32)
    row = upload(device, x[5], F32)
    out = Tensor.empty(device, F16, (33, 1000))
    bcast = Tensor.empty(device, F32, (1000, 4))
    try:
        wide = row.view((1000, 4), nb=(4, 0))                        # the same row 4 times
        run_once(device, lambda seq: (copy(seq, src.transpose(), out), copy(seq, wide, bcast)))
        assert same_bits(read_tensor(out), x.T.astype(np.float16))
        assert same_bits(read_tensor(bcast), np.tile(x[5], (4, 1)))
    finally:
        for t in (src, row, out, bcast):
            t.close()


def test_reshaping_copy_uses_flat_order(device):
    x = np.arange(6 * 4, dtype=np.float32).reshape(4, 6)
    src = upload(device, x, F32)
    dst = Tensor.empty(device, F16, (8, 3))
    back = Tensor.empty(device, F32, (6, 4))
    try:
        run_once(device, lambda seq: copy(seq, src.transpose(), dst))    # strided src, contiguous dst
        assert same_bits(read_tensor(dst), x.T.reshape(3, 8).astype(np.float16))
        run_once(device, lambda seq: copy(seq, dst, back.transpose()))   # contiguous src, strided dst
        assert same_bits(read_tensor(back), x.T.reshape(6, 4).T)
    finally:
        for t in (src, dst, back):
            t.close()


def test_special_values_convert_like_numpy(device):
    f16 = np.array([0.0, -0.0, np.inf, -np.inf, 65504, -65504, 6e-8, -6e-8, 6.1e-5, 1 / 3, 1e-4],
                   dtype=np.float16)
    f32 = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519, 65520, 1e6, 1 + 2**-11, 1 + 3 * 2**-11,
                    2**-24, 2**-25, 3 * 2**-26, 1e-30, -1e-30, 0.1, -7.3], dtype=np.float32)
    bf16 = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x3F80, 0x0001, 0x8001, 0x7F7F, 0x4049], dtype=np.uint16)
    cases = [(f16, F16, F32), (f32, F32, F16), (bf16, BF16, F32), (bf16, BF16, F16)]
    for x, s, d in cases:
        src = upload(device, x, s)
        dst = Tensor.empty(device, d, (x.size,))
        try:
            run_once(device, lambda seq: copy(seq, src, dst))
            assert same_bits(read_tensor(dst), reference(x, s, d)), (s, d)
        finally:
            src.close()
            dst.close()
    nan = np.array([np.nan, -np.nan], np.float32)
    src, dst = upload(device, nan, F32), Tensor.empty(device, F16, (2,))
    try:
        run_once(device, lambda seq: copy(seq, src, dst))
        assert np.isnan(read_tensor(dst)).all()
    finally:
        src.close()
        dst.close()


@pytest.mark.parametrize("typ", [F32, F16], ids=lambda t: t.name)
def test_same_type_moves_bits_exactly(device, typ):
    """NaN payloads and signalling NaNs survive a strided same-type copy."""
    bits = np.random.default_rng(5).integers(0, 2 ** (8 * typ.type_size), size=(40, 33), dtype=np.uint64)
    x = bits.astype(np.uint32 if typ == F32 else np.uint16).view(typ.dtype)
    src = upload(device, x, typ)
    dst = Tensor.empty(device, typ, (40, 33))
    try:
        run_once(device, lambda seq: copy(seq, src.transpose(), dst))
        assert same_bits(read_tensor(dst), x.T)
    finally:
        src.close()
        dst.close()


def test_without_16bit_storage(device, monkeypatch):
    """Devices without 16-bit storage: 16-bit elements as halves of words, stores by atomics,
    at odd element offsets on both sides."""
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, storage_16bit=False))
    rng = np.random.default_rng(11)
    x = random_values(F32, (31, 33), rng)
    h = random_values(F16, (31, 33), rng)
    src32, src16 = upload(device, x, F32), upload(device, h, F16)
    out = upload(device, np.zeros((31, 35), np.float16), F16)
    out32 = Tensor.empty(device, F32, (31, 33))
    try:
        dst = out.slice(0, 1, 34)                                   # odd offset, strided rows
        run_once(device, lambda seq: copy(seq, src32, dst))
        expect = np.zeros((31, 35), np.float16)
        expect[:, 1:34] = x.astype(np.float16)
        assert same_bits(read_tensor(out), expect)
        run_once(device, lambda seq: copy(seq, src16.slice(0, 1, 32), dst.slice(0, 1, 32)))  # f16 -> f16, bits
        expect[:, 2:33] = h[:, 1:32]
        assert same_bits(read_tensor(out), expect)
        run_once(device, lambda seq: copy(seq, src16.transpose(), out32))
        assert same_bits(read_tensor(out32), h.T.astype(np.float32))
    finally:
        for t in (src32, src16, out, out32):
            t.close()


def test_split_over_small_bindings(device, monkeypatch):
    """With a tiny maxStorageBufferRange every copy is cut into many dispatches."""
    small = dataclasses.replace(device.profile, max_storage_buffer_range=1024)
    rng = np.random.default_rng(2)
    x = random_values(F32, (3, 33, 70), rng)
    src = upload(device, x, F32)
    dst = Tensor.empty(device, F16, (33, 70, 3))
    try:
        monkeypatch.setattr(device, "profile", small)
        view = src.permute(1, 0, 2, 3)                              # ne (33, 70, 3), strided
        assert len(binding_pieces([view, dst])) > 8
        run_once(device, lambda seq: copy(seq, view, dst))
        monkeypatch.undo()
        assert same_bits(read_tensor(dst), x.transpose(0, 2, 1).astype(np.float16))
    finally:
        src.close()
        dst.close()


def test_strided_view_spanning_more_than_a_binding(device, lavapipe_binding_limit):
    """A 64 x 40 view whose rows lie 3.75 MiB apart spans ~146 MiB: written and read back
    through split dispatches without moving the 146 MiB."""
    limit = device.profile.max_storage_buffer_range
    row = 15 << 18                                                  # bytes between rows
    x = np.random.default_rng(4).standard_normal((40, 64)).astype(np.float32)
    big = Tensor.empty(device, F32, (row // 4, 40))
    small, back = upload(device, x, F32), Tensor.empty(device, F32, (64, 40))
    try:
        view = big.view((64, 40), nb=(4, row), offset=12)
        assert view.span > limit
        run_once(device, lambda seq: (copy(seq, small, view), copy(seq, view, back)))
        assert same_bits(read_tensor(back), x)
    finally:
        for t in (big, small, back):
            t.close()


@pytest.mark.slow
def test_tensor_larger_than_128_mib(device, lavapipe_binding_limit):
    """f16 -> f32 into a 135 MiB destination: more than one binding may hold on lavapipe."""
    ne = (4096, 8256)
    x = (np.arange(ne[0] * ne[1], dtype=np.uint32) % 60000).astype(np.float16).reshape(ne[1], ne[0])
    src = upload(device, x, F16)
    dst = Tensor.empty(device, F32, ne)
    try:
        assert dst.nbytes > 128 << 20 and dst.nbytes > min(device.profile.max_storage_buffer_range, 128 << 20)
        run_once(device, lambda seq: copy(seq, src, dst))
        got = read_tensor(dst)
        assert same_bits(got, x.astype(np.float32))
    finally:
        src.close()
        dst.close()


def test_copy_errors(device):
    made = [Tensor.empty(device, *spec) for spec in ((F32, (8, 2)), (BF16, (8, 2)), (I32, (8, 2)),
                                                     ("Q8_0", (32, 1)), (F32, (8, 3)))]
    a, as_bf16, as_i32, q8, wrong = made
    try:
        with pytest.raises(GGMLTypeError, match="cannot convert F32 to BF16"):
            copy(None, a, as_bf16)
        with pytest.raises(GGMLTypeError, match="cannot convert F32 to I32"):
            copy(None, a, as_i32)
        with pytest.raises(GGMLTypeError, match="Q8_0"):
            copy(None, q8, q8)
        with pytest.raises(OutOfRange, match="16 elements"):
            copy(None, a, wrong)
        with pytest.raises(OutOfRange, match="zero stride"):
            copy(None, a, a.view((8, 2), nb=(4, 0)))
        with pytest.raises(OutOfRange, match="neither is contiguous"):
            copy(None, a.transpose(), a.view((4, 2, 2), nb=(8, 4, 32)))
    finally:
        for t in made:
            t.close()


def _capabilities(spirv: bytes) -> set[int]:
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    caps, i = set(), 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if op == 17:  # OpCapability
            caps.add(words[i + 1])
        i += count
    return caps


FLOAT16, INT16, STORAGE_BUFFER_16BIT = 9, 22, 4433


@pytest.mark.parametrize("storage16", [0, 1])
def test_data_movement_shaders_use_no_16bit_arithmetic(storage16):
    """GCN has no fp16 math: only 16-bit *storage* may appear, and only where the device has it."""
    s = {"STORAGE16": storage16}
    builds = [("copy", {"SRC_TYPE": 1, "SRC_BITS": 16, "DST_TYPE": 0, "DST_BITS": 32, **s}),
              ("copy", {"SRC_TYPE": 0, "SRC_BITS": 32, "DST_TYPE": 1, "DST_BITS": 16, **s}),
              ("copy", {"SRC_TYPE": 30, "SRC_BITS": 16, "DST_TYPE": 1, "DST_BITS": 16, **s}),
              ("transpose", {"TILE": 32, "BITS": 16, **s}),
              ("concat_transposed", {"TILE": 32, "BITS": 16, **s}),
              ("concat", {"A_TYPE": 1, "A_BITS": 16, "B_TYPE": 30, "B_BITS": 16, "DST_TYPE": 1, "DST_BITS": 16, **s})]
    for name, defines in builds:
        caps = _capabilities(compile_shader(name, defines))
        assert FLOAT16 not in caps and INT16 not in caps, name
        assert (STORAGE_BUFFER_16BIT in caps) == bool(storage16), name
