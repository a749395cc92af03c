"""Scaled dot products for the super-block types (k-quants, IQ4_XS), as numba intrinsics that
accumulate in a vector: an Acc holds 8 int32 partial sums; each call adds the products of 32
weights with 32 int8 activations (q8_K, |x| <= 127), the first 16 products weighted by the scale
sc0 and the last 16 by sc1; acc_sum reduces once per super-block.

    acc_zero()                                    an Acc of zeros
    acc_sum(acc)                                  the int32 sum of its lanes
    mac_fields(acc, w, lo, lo_shift, lo_bits, hi, hi_shift, hi_bits, x, xo, sc0, sc1)
        v_j = ((w[lo+j] >> lo_shift) & (2^lo_bits - 1)) | (((w[hi+j] >> hi_shift) & (2^hi_bits - 1)) << lo_bits)
        (hi_bits 0: no high part), acc + sum_{j<16} sc0 v_j x[xo+j] + sum_{16<=j<32} sc1 v_j x[xo+j]
    mac_lut_nibbles(acc, w, wo, lut, x, xo, sc)
        acc + sc sum_j lut[n_j] x[xo+j], n_0..n_15 the low nibbles of w[wo:wo+16], n_16..n_31 the high

The callers keep v_j <= 63, |lut| <= 127 and the scales within int16; every sum is then exact.
On x86 the products go as llama.cpp's CPU backend does them: pmaddubsw (pairs of u8 x s8 into
int16, the table values' signs moved onto x by psignb), then pmaddwd with the scales, a table
lookup by pshufb; AVX2 at 256 bits, SSSE3 at 128. Elsewhere the same sums in portable vector IR.
"""

from __future__ import annotations

from typing import NamedTuple

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils, config, errors
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model

from .simd import I8, I16, I32, I64, _load

LANES = 8
_ACC = ir.VectorType(I32, LANES)
PATHS = ("avx2", "ssse3", "portable")


class Acc(types.Type):
    """8 int32 partial sums held in a vector register."""

    def __init__(self):
        super().__init__(name="simd_k.Acc")


acc_type = Acc()


@register_model(Acc)
class _AccModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _ACC)


def host_path() -> str:
    """The code path numba's target takes: 'avx2' or 'ssse3' on such x86 CPUs, else 'portable'."""
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else llvm.get_host_cpu_features().flatten()
    flags = features.split(",")
    if llvm.get_process_triple().split("-")[0] not in ("x86_64", "i386", "i486", "i586", "i686"):
        return "portable"
    return "avx2" if "+avx2" in flags else "ssse3" if "+ssse3" in flags else "portable"


def _vec(ty, n):
    return ir.VectorType(ty, n)


def _lanes(values):
    return ir.Constant(_vec(I32, len(values)), list(values))


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _broadcast(builder, value, ty, n: int):
    """<n x ty> of the scalar `value`, truncated or sign-extended to ty."""
    if value.type.width > ty.width:
        value = builder.trunc(value, ty)
    elif value.type.width < ty.width:
        value = builder.sext(value, ty)
    vec = builder.insert_element(ir.Constant(_vec(ty, n), ir.Undefined), value, I32(0))
    return builder.shuffle_vector(vec, vec, _lanes([0] * n))


def _pieces(builder, vec, width: int):
    """`vec` cut into consecutive vectors of `width` lanes."""
    n = vec.type.count
    return [builder.shuffle_vector(vec, vec, _lanes(range(k, k + width))) for k in range(0, n, width)]


def _join(builder, parts):
    """The vectors `parts` (equal widths, a power of two in number) laid end to end."""
    while len(parts) > 1:
        n = parts[0].type.count
        parts = [builder.shuffle_vector(a, b, _lanes(range(2 * n))) for a, b in zip(parts[::2], parts[1::2])]
    return parts[0]


def _pair_sums_portable(builder, v, xv, signed):
    """<16 x i16>: v_2k x_2k + v_2k+1 x_2k+1 over <32 x i8> v (unsigned, or signed) and x."""
    w16 = _vec(I16, 32)
    prod = builder.mul((builder.sext if signed else builder.zext)(v, w16), builder.sext(xv, w16))
    return builder.add(builder.shuffle_vector(prod, prod, _lanes(range(0, 32, 2))),
                       builder.shuffle_vector(prod, prod, _lanes(range(1, 32, 2))))


def _madd_portable(builder, pairs, scales):
    """<8 x i32>: p_2k s_2k + p_2k+1 s_2k+1 over <16 x i16> p and s."""
    wide = builder.mul(builder.sext(pairs, _vec(I32, 16)), builder.sext(scales, _vec(I32, 16)))
    return builder.add(builder.shuffle_vector(wide, wide, _lanes(range(0, 16, 2))),
                       builder.shuffle_vector(wide, wide, _lanes(range(1, 16, 2))))


def _x86_ops(width: int):
    """pair sums and madd of <32 x i8> / <16 x i16> operands by x86 instructions of `width` bytes."""
    if width == 32:
        maddubs_fn, madd_fn, sign_fn = "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd", "llvm.x86.avx2.psign.b"
    else:
        maddubs_fn, madd_fn, sign_fn = ("llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd",
                                        "llvm.x86.ssse3.psign.b.128")

    def pair_sums(builder, v, xv, signed):
        out = []
        for vp, xp in zip(_pieces(builder, v, width), _pieces(builder, xv, width)):
            if signed:
                xp = _call(builder, sign_fn, xp.type, [xp, vp])
                vp = _call(builder, f"llvm.abs.v{width}i8", vp.type, [vp, ir.Constant(ir.IntType(1), 0)])
            out.append(_call(builder, maddubs_fn, _vec(I16, width // 2), [vp, xp]))
        return _join(builder, out)

    def madd(builder, pairs, scales):
        parts = zip(_pieces(builder, pairs, width // 2), _pieces(builder, scales, width // 2))
        return _join(builder, [_call(builder, madd_fn, _vec(I32, width // 4), [p, s]) for p, s in parts])

    return pair_sums, madd


def _scaled(builder, path, v, xv, signed, sc0, sc1):
    """<8 x i32> of the products v_j x_j, the first 16 scaled by sc0, the last 16 by sc1."""
    if path == "portable":
        pair_sums, madd = _pair_sums_portable, _madd_portable
    else:
        pair_sums, madd = _x86_ops(32 if path == "avx2" else 16)
    scales = builder.shuffle_vector(_broadcast(builder, sc0, I16, 8), _broadcast(builder, sc1, I16, 8), _lanes(range(16)))
    return madd(builder, pair_sums(builder, v, xv, signed), scales)


def _field(builder, wv, shift, bits):
    """(wv >> shift) & (2^bits - 1) lane by lane, wv <32 x i8>."""
    mask = builder.sub(builder.shl(I8(1), builder.trunc(bits, I8)), I8(1))
    return builder.and_(builder.lshr(wv, _broadcast(builder, shift, I8, 32)), _broadcast(builder, mask, I8, 32))


def _lookup(builder, path, table, idx):
    """table[idx] lane by lane for <16 x i8> indices 0-15."""
    if path != "portable":
        return _call(builder, "llvm.x86.ssse3.pshuf.b.128", idx.type, [table, idx])
    vals = None
    for k in range(16):
        entry = _broadcast(builder, builder.extract_element(table, I32(k)), I8, 16)
        vals = entry if vals is None else builder.select(
            builder.icmp_unsigned("==", idx, ir.Constant(_vec(I8, 16), [k] * 16)), entry, vals)
    return vals


def _check_args(name, acc, arrays, integers):
    """A typing error naming the argument of `name` whose numba type is wrong."""
    if not isinstance(acc, Acc):
        raise errors.TypingError(f"{name}: acc must be an Acc (from acc_zero), got {acc}")
    for arg, (ty, dtype) in arrays.items():
        if not (isinstance(ty, types.Array) and ty.ndim == 1 and ty.dtype == dtype):
            raise errors.TypingError(f"{name}: {arg} must be a 1-d {dtype} array, got {ty}")
    for arg, ty in integers.items():
        if not isinstance(ty, types.Integer):
            raise errors.TypingError(f"{name}: {arg} must be an integer, got {ty}")


@intrinsic
def acc_zero(typingctx):
    """An Acc of zeros."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_ACC, [0] * LANES)

    return acc_type(), codegen


@intrinsic
def acc_sum(typingctx, acc):
    """The int32 sum of the lanes of an Acc."""
    _check_args("acc_sum", acc, {}, {})

    def codegen(context, builder, sig, args):
        return _call(builder, f"llvm.vector.reduce.add.v{LANES}i32", I32, [args[0]])

    return types.int32(acc), codegen


class ScaledDots(NamedTuple):
    """The accumulating intrinsics of one code path."""
    mac_fields: object
    mac_lut_nibbles: object


def scaled_dots(path: str) -> ScaledDots:
    """mac_fields and mac_lut_nibbles on `path`, one of PATHS (an x86 one only for such a target)."""
    if path not in PATHS:
        raise ValueError(f"unknown code path {path!r} (paths: {', '.join(PATHS)})")

    @intrinsic
    def mac_fields(typingctx, acc, w, lo, lo_shift, lo_bits, hi, hi_shift, hi_bits, x, xo, sc0, sc1):
        """acc plus the 32 values v_j (a low and a high bit field of w) times x[xo+j], scaled by
        sc0 (j < 16) and sc1 (j >= 16)."""
        _check_args("mac_fields", acc, {"w": (w, types.uint8), "x": (x, types.int8)},
                    {"lo": lo, "lo_shift": lo_shift, "lo_bits": lo_bits, "hi": hi, "hi_shift": hi_shift,
                     "hi_bits": hi_bits, "xo": xo, "sc0": sc0, "sc1": sc1})

        def codegen(context, builder, sig, args):
            acc_v, w_a, lo_o, lo_s, lo_b, hi_o, hi_s, hi_b, x_a, x_o, s0, s1 = args
            low = _field(builder, _load(context, builder, sig.args[1], w_a, lo_o, 32), lo_s, lo_b)
            high = _field(builder, _load(context, builder, sig.args[1], w_a, hi_o, 32), hi_s, hi_b)
            v = builder.or_(low, builder.shl(high, _broadcast(builder, lo_b, I8, 32)))
            xv = _load(context, builder, sig.args[8], x_a, x_o, 32)
            return builder.add(acc_v, _scaled(builder, path, v, xv, False, s0, s1))

        return acc_type(acc, w, lo, lo_shift, lo_bits, hi, hi_shift, hi_bits, x, xo, sc0, sc1), codegen

    @intrinsic
    def mac_lut_nibbles(typingctx, acc, w, wo, lut, x, xo, sc):
        """acc plus sc times the dot of the 32 table values lut[n_j] (the nibbles of w[wo:wo+16],
        low then high) with x[xo:xo+32]; `lut` holds 16 int8 values, -127 to 127."""
        _check_args("mac_lut_nibbles", acc, {"w": (w, types.uint8), "lut": (lut, types.int8), "x": (x, types.int8)},
                    {"wo": wo, "xo": xo, "sc": sc})

        def codegen(context, builder, sig, args):
            acc_v, w_a, w_o, lut_a, x_a, x_o, s = args
            table = _load(context, builder, sig.args[3], lut_a, I64(0), 16)
            wv = _load(context, builder, sig.args[1], w_a, w_o, 16)
            low = _lookup(builder, path, table, builder.and_(wv, ir.Constant(_vec(I8, 16), [15] * 16)))
            high = _lookup(builder, path, table, builder.lshr(wv, ir.Constant(_vec(I8, 16), [4] * 16)))
            xv = _load(context, builder, sig.args[4], x_a, x_o, 32)
            return builder.add(acc_v, _scaled(builder, path, _join(builder, [low, high]), xv, True, s, s))

        return acc_type(acc, w, wo, lut, x, xo, sc), codegen

    return ScaledDots(mac_fields, mac_lut_nibbles)


mac_fields, mac_lut_nibbles = scaled_dots(host_path())

