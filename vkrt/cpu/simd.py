"""Vector dot products for the CPU expert kernels, written as numba intrinsics in portable LLVM
vector IR: numba compiles them for the CPU it runs on (AVX2, AVX-512, VNNI as present), so no
binary is built for one machine. Each reads `n` bytes of quantised weights at a byte offset and
`n` int8 activations (q8 blocks) at an element offset, and returns the int32 dot product.

    dot_field(w, wo, shift, mask, x, xo, n)  sum_j ((w[wo+j] >> shift) & mask) * x[xo+j]
    dot_i8(w, wo, x, xo, n)                  sum_j int8(w[wo+j]) * x[xo+j]
    dot_lut(w, wo, shift, lut, x, xo, n)     sum_j lut[(w[wo+j] >> shift) & 15] * x[xo+j]  (lut: 16 int8)
    sum_bits(bits, x, xo, n)                 sum_j x[xo+j] where bit j of `bits` is set (n <= 64)

`n` is a literal: 16 or 32. The products fit int16 (|w| <= 127 after the mask or table,
|x| <= 127), the sums int32: the result equals the integer dot product exactly.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import errors
from numba.core import cgutils
from numba.extending import intrinsic

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _literal(n) -> int:
    if not isinstance(n, types.IntegerLiteral):
        raise errors.RequireLiteralValue(n)
    value = n.literal_value
    if value not in (16, 32):
        raise TypeError(f"vector length must be the literal 16 or 32, got {n}")
    return value


def _load(context, builder, arytype, ary, offset, n: int):
    """<n x i8> read from array `ary` at element `offset` (unaligned)."""
    a = context.make_array(arytype)(context, builder, ary)
    ptr = builder.gep(a.data, [offset])
    vec = ir.VectorType(I8, n)
    return builder.load(builder.bitcast(ptr, vec.as_pointer()), align=1)


def _splat(value, n: int, ty=I8):
    return ir.Constant(ir.VectorType(ty, n), [value] * n)


def _reduce(builder, vec, n: int):
    """The int32 sum of <n x i16> products."""
    wide = builder.sext(vec, ir.VectorType(I32, n))
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I32, [ir.VectorType(I32, n)]),
                                        f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [wide])


def _mul(builder, w16, xvec, n: int):
    return builder.mul(w16, builder.sext(xvec, ir.VectorType(I16, n)))


@intrinsic
def dot_field(typingctx, w, wo, shift, mask, x, xo, n):
    """sum_j ((w[wo+j] >> shift) & mask) * x[xo+j], j < n."""
    length = _literal(n)

    def codegen(context, builder, sig, args):
        wv = _load(context, builder, sig.args[0], args[0], args[1], length)
        sh = builder.trunc(args[2], I8)
        mk = builder.trunc(args[3], I8)
        sh_v = builder.insert_element(ir.Constant(ir.VectorType(I8, length), ir.Undefined), sh, I32(0))
        sh_v = builder.shuffle_vector(sh_v, sh_v, ir.Constant(ir.VectorType(I32, length), [0] * length))
        mk_v = builder.insert_element(ir.Constant(ir.VectorType(I8, length), ir.Undefined), mk, I32(0))
        mk_v = builder.shuffle_vector(mk_v, mk_v, ir.Constant(ir.VectorType(I32, length), [0] * length))
        field = builder.and_(builder.lshr(wv, sh_v), mk_v)
        xv = _load(context, builder, sig.args[4], args[4], args[5], length)
        return _reduce(builder, _mul(builder, builder.zext(field, ir.VectorType(I16, length)), xv, length), length)

    return types.int32(w, wo, shift, mask, x, xo, n), codegen


@intrinsic
def dot_i8(typingctx, w, wo, x, xo, n):
    """sum_j int8(w[wo+j]) * x[xo+j], j < n."""
    length = _literal(n)

    def codegen(context, builder, sig, args):
        wv = _load(context, builder, sig.args[0], args[0], args[1], length)
        xv = _load(context, builder, sig.args[2], args[2], args[3], length)
        return _reduce(builder, _mul(builder, builder.sext(wv, ir.VectorType(I16, length)), xv, length), length)

    return types.int32(w, wo, x, xo, n), codegen


@intrinsic
def dot_lut(typingctx, w, wo, shift, lut, x, xo, n):
    """sum_j lut[(w[wo+j] >> shift) & 15] * x[xo+j], j < n; `lut` holds 16 int8 values."""
    length = _literal(n)

    def codegen(context, builder, sig, args):
        wv = _load(context, builder, sig.args[0], args[0], args[1], length)
        sh = builder.trunc(args[2], I8)
        sh_v = builder.insert_element(ir.Constant(ir.VectorType(I8, length), ir.Undefined), sh, I32(0))
        sh_v = builder.shuffle_vector(sh_v, sh_v, ir.Constant(ir.VectorType(I32, length), [0] * length))
        idx = builder.and_(builder.lshr(wv, sh_v), _splat(15, length))
        table = _load(context, builder, sig.args[3], args[3], I64(0), 16)
        vals = ir.Constant(ir.VectorType(I8, length), ir.Undefined)
        # a select tree the backend lowers to byte shuffles (pshufb / vpermb) where it can
        for k in range(16):
            hit = builder.icmp_unsigned("==", idx, _splat(k, length))
            entry = builder.extract_element(table, I32(k))
            e_v = builder.insert_element(ir.Constant(ir.VectorType(I8, length), ir.Undefined), entry, I32(0))
            e_v = builder.shuffle_vector(e_v, e_v, ir.Constant(ir.VectorType(I32, length), [0] * length))
            vals = builder.select(hit, e_v, vals) if k else e_v
        xv = _load(context, builder, sig.args[4], args[4], args[5], length)
        return _reduce(builder, _mul(builder, builder.sext(vals, ir.VectorType(I16, length)), xv, length), length)

    return types.int32(w, wo, shift, lut, x, xo, n), codegen


@intrinsic
def sum_bits(typingctx, bits, x, xo, n):
    """sum_j x[xo+j] over the set bits j of the integer `bits`, j < n."""
    length = _literal(n)

    def codegen(context, builder, sig, args):
        b64 = context.cast(builder, args[0], sig.args[0], types.uint64)
        b_v = builder.insert_element(ir.Constant(ir.VectorType(I64, length), ir.Undefined), b64, I32(0))
        b_v = builder.shuffle_vector(b_v, b_v, ir.Constant(ir.VectorType(I32, length), [0] * length))
        one = ir.Constant(ir.VectorType(I64, length), [1 << j for j in range(length)])
        hit = builder.icmp_unsigned("!=", builder.and_(b_v, one), _splat(0, length, I64))
        xv = _load(context, builder, sig.args[1], args[1], args[2], length)
        picked = builder.select(hit, builder.sext(xv, ir.VectorType(I16, length)), _splat(0, length, I16))
        return _reduce(builder, picked, length)

    return types.int32(bits, x, xo, n), codegen
