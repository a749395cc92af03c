"""Dot products of whole 32-value nibble blocks for the CPU expert kernels, as numba intrinsics.
Each reads the 16 bytes at byte offset `wo` of the uint8 array `w`, whose low nibbles n_0..n_15
are values 0-15 and high nibbles n_16..n_31 values 16-31 (the 32-value block types' layout),
and the 32 int8 activations x[xo:xo+32] (|x| <= 127), and returns the int32 dot product:

    dot_nibbles(w, wo, x, xo)              sum_j n_j * x[xo+j]
    dot_nibbles5(w, wo, bits, x, xo)       sum_j (n_j + 16 bit_j) * x[xo+j]  (bit j of the uint32 `bits`)
    dot_lut_nibbles(w, wo, lut, x, xo)     sum_j lut[n_j] * x[xo+j]  (lut: 16 int8 in -127..127)

One reduction per block instead of one per 16 values. On x86
CPUs with SSSE3 the table lookup is a byte shuffle (pshufb) and the products are summed as
llama.cpp's CPU backend does (pmaddubsw, pmaddwd); elsewhere the portable vector IR of simd.py,
a select tree for the table. Every sum is exact.
"""

from __future__ import annotations

from typing import NamedTuple

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

from .simd import I8, I16, I32, I64, _load, _reduce, _splat

_V16 = ir.VectorType(I8, 16)


def has_ssse3() -> bool:
    """Whether numba's target is an x86 CPU with SSSE3 (its features as numba takes them)."""
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else llvm.get_host_cpu_features().flatten()
    x86 = llvm.get_process_triple().split("-")[0] in ("x86_64", "i386", "i486", "i586", "i686")
    return x86 and "+ssse3" in features.split(",")


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _lanes(values):
    return ir.Constant(ir.VectorType(I32, len(values)), list(values))


def _nibbles(context, builder, sig, args):
    """The 32 nibbles of w[wo:wo+16] as two <16 x i8>: low, high."""
    wv = _load(context, builder, sig.args[0], args[0], args[1], 16)
    return builder.and_(wv, _splat(15, 16)), builder.lshr(wv, _splat(4, 16))


def _halves(builder, vals):
    """<32 x i8> as its two <16 x i8> halves."""
    return tuple(builder.shuffle_vector(vals, vals, _lanes(range(h, h + 16))) for h in (0, 16))


def _pshufb(builder, table, idx):
    return _call(builder, "llvm.x86.ssse3.pshuf.b.128", _V16, [table, idx])


def _select_tree(builder, table, idx):
    vals = None
    for k in range(16):
        entry = builder.insert_element(ir.Constant(_V16, ir.Undefined), builder.extract_element(table, I32(k)), I32(0))
        entry = builder.shuffle_vector(entry, entry, _lanes([0] * 16))
        vals = entry if vals is None else builder.select(builder.icmp_unsigned("==", idx, _splat(k, 16)), entry, vals)
    return vals


def _x86_dot(context, builder, sig, args, halves, signed: bool):
    """sum_j v_j x_j over two <16 x i8> halves of v by pmaddubsw (|v| times x signed by v when v
    is signed) and pmaddwd: pairs of products stay within int16 as |v|, |x| <= 127."""
    xarg = len(sig.args) - 2
    acc = None
    for h, v in enumerate(halves):
        xv = _load(context, builder, sig.args[xarg], args[xarg], builder.add(args[xarg + 1], I64(16 * h)), 16)
        if signed:
            xv = _call(builder, "llvm.x86.ssse3.psign.b.128", _V16, [xv, v])
            v = _call(builder, "llvm.abs.v16i8", _V16, [v, ir.Constant(ir.IntType(1), 0)])
        pairs = _call(builder, "llvm.x86.ssse3.pmadd.ub.sw.128", ir.VectorType(I16, 8), [v, xv])
        quads = _call(builder, "llvm.x86.sse2.pmadd.wd", ir.VectorType(I32, 4), [pairs, _splat(1, 8, I16)])
        acc = quads if acc is None else builder.add(acc, quads)
    return _call(builder, "llvm.vector.reduce.add.v4i32", I32, [acc])


def _portable_dot(context, builder, sig, args, halves, signed: bool):
    """sum_j v_j x_j over two <16 x i8> halves of v in portable vector IR."""
    xarg = len(sig.args) - 2
    vals = builder.shuffle_vector(halves[0], halves[1], _lanes(range(32)))
    widen = builder.sext if signed else builder.zext
    xv = _load(context, builder, sig.args[xarg], args[xarg], args[xarg + 1], 32)
    prod = builder.mul(widen(vals, ir.VectorType(I16, 32)), builder.sext(xv, ir.VectorType(I16, 32)))
    return _reduce(builder, prod, 32)


class NibbleDots(NamedTuple):
    """The three nibble-block dot intrinsics of one code path."""
    dot_nibbles: object
    dot_nibbles5: object
    dot_lut_nibbles: object


def nibble_dots(x86: bool) -> NibbleDots:
    """The intrinsics on the x86 SSSE3 path (x86=True; only for such a target) or the portable one."""
    if x86 and not has_ssse3():
        raise ValueError("the x86 nibble dots need an x86 target with SSSE3; this one has none")
    dot = _x86_dot if x86 else _portable_dot

    @intrinsic
    def dot_nibbles(typingctx, w, wo, x, xo):
        """sum_j n_j * x[xo+j] over the 32 nibbles n_j of w[wo:wo+16]."""
        def codegen(context, builder, sig, args):
            return dot(context, builder, sig, args, _nibbles(context, builder, sig, args), False)

        return types.int32(w, wo, x, xo), codegen

    @intrinsic
    def dot_nibbles5(typingctx, w, wo, bits, x, xo):
        """sum_j (n_j + 16 bit_j) * x[xo+j] over the 32 nibbles n_j of w[wo:wo+16], bit_j of `bits`."""
        def codegen(context, builder, sig, args):
            lo, hi = _nibbles(context, builder, sig, args)
            b32 = context.cast(builder, args[2], sig.args[2], types.uint32)
            bit_mask = builder.bitcast(b32, ir.VectorType(ir.IntType(1), 32))
            fifth = builder.select(bit_mask, _splat(16, 32), _splat(0, 32))
            vals = builder.or_(builder.shuffle_vector(lo, hi, _lanes(range(32))), fifth)
            return dot(context, builder, sig, args, _halves(builder, vals), False)

        return types.int32(w, wo, bits, x, xo), codegen

    @intrinsic
    def dot_lut_nibbles(typingctx, w, wo, lut, x, xo):
        """sum_j lut[n_j] * x[xo+j] over the 32 nibbles n_j of w[wo:wo+16]; `lut` holds 16 int8."""
        lookup = _pshufb if x86 else _select_tree

        def codegen(context, builder, sig, args):
            table = _load(context, builder, sig.args[2], args[2], I64(0), 16)
            halves = [lookup(builder, table, n) for n in _nibbles(context, builder, sig, args)]
            return dot(context, builder, sig, args, halves, True)

        return types.int32(w, wo, lut, x, xo), codegen

    return NibbleDots(dot_nibbles, dot_nibbles5, dot_lut_nibbles)


dot_nibbles, dot_nibbles5, dot_lut_nibbles = nibble_dots(has_ssse3())
