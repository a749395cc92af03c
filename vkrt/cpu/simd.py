"""Vector dot products for the CPU expert kernels, written as numba intrinsics in portable LLVM
vector IR: numba compiles them for the CPU it runs on (AVX2, AVX-512, VNNI as present), so no
binary is built for one machine. The helpers here (loads, splats, the int32 reduction) serve the
other simd_* modules; dot_i8(w, wo, x, xo, n) is sum_j int8(w[wo+j]) * x[xo+j] over n (the
literal 16 or 32) int8 weights at byte offset wo and q8 activations at element offset xo. The
products fit int16 (|w|, |x| <= 127), the sums int32: the integer dot product exactly.

A field dot per 16 or 32 values (one reduction each, and a 16-way select for table lookups) lost to
the whole-block intrinsics of simd_lut.py / simd_k.py: Q4_0 3.5 -> 6.7 GB/s a thread, IQ4_NL
1.0 -> 6.1, Q6_K 2.1 -> 15.7 on this project's Xeon.
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
def dot_i8(typingctx, w, wo, x, xo, n):
    """sum_j int8(w[wo+j]) * x[xo+j], j < n."""
    length = _literal(n)

    def codegen(context, builder, sig, args):
        wv = _load(context, builder, sig.args[0], args[0], args[1], length)
        xv = _load(context, builder, sig.args[2], args[2], args[3], length)
        return _reduce(builder, _mul(builder, builder.sext(wv, ir.VectorType(I16, length)), xv, length), length)

    return types.int32(w, wo, x, xo, n), codegen
