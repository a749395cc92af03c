"""The vector dots of the grid i-quants and the byte reads around them, numba intrinsics in
portable LLVM IR (as simd.py), each over 32 values whose weights are grid entries: `grid` a
uint64 (8 values an entry) or uint32 (4 values) array of packed bytes, value j of an entry in its
byte j, and `idx` the tuple of the 4 or 8 entry indices. `scales` is a tuple of one integer
multiplier for all 32 values or two, one for each 16.

    dot_grid(grid, idx, signs, scales, x, xo)
        sum_j scale_j * g_j * (-1)^(bit j of signs) * x[xo+j]   with g the unsigned grid bytes:
        the signs flip the activations, so the dot is unsigned bytes times int8, which the
        backend turns into vpdpbusd where the CPU has VNNI (pmaddwd elsewhere)

    dot_signed_grid(grid, idx, scales, x, xo)
        sum_j scale_j * g_j * x[xo+j]   with g the int8 grid bytes (signs already applied); a
        pair of scales multiplies the values in int16 (|scale * g| < 32768), then pmaddwd

    read_le(w, o, n)
        the n bytes (literal 2, 4 or 8) of the uint8 array w at offset o as one little-endian
        int64, read unaligned with no bounds check (8 bytes: the top bit is the sign, so mask
        fields taken by shifting)

The activations are int8 q8 values (|x| <= 127); the result is the exact integer dot while
32 * max|g| * 127 * max scale < 2^31 (the i-quant grids: bytes <= 62, scales <= 31)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils, errors
from numba.extending import intrinsic

I1, I8, I16, I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
N = 32   # values a dot
HALF = N // 2


def _ints(t) -> bool:
    return isinstance(t, types.BaseTuple) and all(isinstance(e, types.Integer) for e in t)


def _check(name, grid, idx, scales) -> int:
    """The bytes an entry of a grid dot, its arguments checked."""
    if not isinstance(grid, types.Array) or grid.dtype not in (types.uint64, types.uint32):
        raise TypeError(f"{name}: the grid must be a uint64 or uint32 array, got {grid}")
    if not _ints(idx):
        raise TypeError(f"{name}: the indices must be a tuple of integers, got {idx}")
    width = grid.dtype.bitwidth // 8
    if width * len(idx) != N:
        raise TypeError(f"{name}: {len(idx)} entries of {width} values are not {N} values")
    if not _ints(scales) or len(scales) not in (1, 2):
        raise TypeError(f"{name}: the scales must be a tuple of 1 or 2 integers, got {scales}")
    return width


def _gather(context, builder, gridtype, grid, idxtype, idx, width: int):
    """<N x i8>: the bytes of the entries idx of the grid, in turn."""
    table = context.make_array(gridtype)(context, builder, grid)
    count = N // width
    entries = ir.Constant(ir.VectorType(ir.IntType(8 * width), count), ir.Undefined)
    for k in range(count):
        i = context.cast(builder, builder.extract_value(idx, k), idxtype[k], types.intp)
        entries = builder.insert_element(entries, builder.load(builder.gep(table.data, [i])), I32(k))
    return builder.bitcast(entries, ir.VectorType(I8, N))


def _load(context, builder, arytype, ary, offset):
    a = context.make_array(arytype)(context, builder, ary)
    return builder.load(builder.bitcast(builder.gep(a.data, [offset]), ir.VectorType(I8, N).as_pointer()), align=1)


def _scale_values(context, builder, tupletype, tup, to):
    return [context.cast(builder, builder.extract_value(tup, k), tupletype[k], to) for k in range(len(tupletype))]


def _reduce(builder, vec, n: int):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I32, [ir.VectorType(I32, n)]),
                                        f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [vec])


def _dot(builder, a, x, n: int, extend_a):
    """The int32 sum of extend_a(a) * sext(x) over n lanes."""
    wide = ir.VectorType(I32, n)
    return _reduce(builder, builder.mul(extend_a(a, wide), builder.sext(x, wide), flags=["nsw"]), n)


def _halves(builder, vec):
    picks = [ir.Constant(ir.VectorType(I32, HALF), list(range(h * HALF, (h + 1) * HALF))) for h in range(2)]
    return [builder.shuffle_vector(vec, vec, pick) for pick in picks]


@intrinsic
def dot_grid(typingctx, grid, idx, signs, scales, x, xo):
    """sum_j scale_j (unsigned byte j of the grid entries idx) (-1)^(bit j of signs) x[xo+j], j < 32."""
    width = _check("dot_grid", grid, idx, scales)
    if not isinstance(signs, types.Integer):
        raise TypeError(f"dot_grid: the signs must be an integer, got {signs}")

    def codegen(context, builder, sig, args):
        vals = _gather(context, builder, sig.args[0], args[0], sig.args[1], args[1], width)
        xv = _load(context, builder, sig.args[4], args[4], args[5])
        bits = context.cast(builder, args[2], sig.args[2], types.uint64)
        flip = builder.bitcast(builder.trunc(bits, ir.IntType(N)), ir.VectorType(I1, N))
        xv = builder.select(flip, builder.neg(xv), xv)
        sc = _scale_values(context, builder, sig.args[3], args[3], types.int32)
        if len(sc) == 1:
            return builder.mul(_dot(builder, vals, xv, N, builder.zext), sc[0])
        # each half its own dot (split before widening, so the backend still sees u8 x i8)
        parts = [builder.mul(_dot(builder, v, xh, HALF, builder.zext), s)
                 for v, xh, s in zip(_halves(builder, vals), _halves(builder, xv), sc)]
        return builder.add(*parts)

    return types.int32(grid, idx, signs, scales, x, xo), codegen


@intrinsic
def dot_signed_grid(typingctx, grid, idx, scales, x, xo):
    """sum_j scale_j (int8 byte j of the grid entries idx) x[xo+j], j < 32."""
    width = _check("dot_signed_grid", grid, idx, scales)

    def codegen(context, builder, sig, args):
        vals = _gather(context, builder, sig.args[0], args[0], sig.args[1], args[1], width)
        xv = _load(context, builder, sig.args[3], args[3], args[4])
        sc = _scale_values(context, builder, sig.args[2], args[2], types.int16)
        if len(sc) == 1:
            return builder.mul(_dot(builder, vals, xv, N, builder.sext), builder.sext(sc[0], I32))
        pair = ir.Constant(ir.VectorType(I16, 2), ir.Undefined)
        pair = builder.insert_element(builder.insert_element(pair, sc[0], I32(0)), sc[1], I32(1))
        spread = ir.Constant(ir.VectorType(I32, N), [j // HALF for j in range(N)])
        per_value = builder.shuffle_vector(pair, pair, spread)
        scaled = builder.mul(builder.sext(vals, ir.VectorType(I16, N)), per_value, flags=["nsw"])
        return _dot(builder, scaled, xv, N, builder.sext)

    return types.int32(grid, idx, scales, x, xo), codegen


@intrinsic
def read_le(typingctx, w, o, n):
    """The n bytes of w at offset o as one little-endian int64 (no bounds or wraparound checks)."""
    if not isinstance(w, types.Array) or w.dtype != types.uint8:
        raise TypeError(f"read_le: the bytes must be a uint8 array, got {w}")
    if not isinstance(n, types.IntegerLiteral):
        raise errors.RequireLiteralValue(n)
    size = n.literal_value
    if size not in (2, 4, 8):
        raise TypeError(f"read_le: the byte count must be the literal 2, 4 or 8, got {n}")

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(a.data, [args[1]]), ir.IntType(8 * size).as_pointer())
        value = builder.load(ptr, align=1)
        return value if size == 8 else builder.zext(value, ir.IntType(64))

    return types.int64(w, o, n), codegen
