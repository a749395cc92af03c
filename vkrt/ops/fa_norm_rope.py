"""norm_rope in flash attention's prologue (flash_attn.comp NORM_ROPE_IN, shaders/fa_norm_rope.glsl):
for a decode step of one token, the q/k RMS norm, RoPE and the K/V cache stores done by the
attention's own workgroups, bit for bit as norm_rope does them, so the step has no norm_rope
dispatch and barrier between the projections and the attention."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..memory import F16, F32, I32, Tensor
from ..pipeline import PushConstants
from .binding import bind_tensor, bind_words, f32_binding
from .hadamard import rotation_defines
from .kv_quant import is_quantised, kvq_words
from .reduce import butterfly_subgroups, norm_wg, subgroup_defines
from .rope import rope_flag_defines, rope_operands

# flash_attn.comp's push block under NORM_ROPE_IN: FA_PUSH less the fields a one-token step
# fixes (N, the token and batch strides, the mask's planes, ALiBi), plus the prologue's
FA_NORM_ROPE_PUSH = PushConstants(
    *((n, "u32") for n in ("KV", "n_head", "gqa", "q_off", "q_nb2", "k_off", "k_nb1", "k_nb2", "v_off", "v_nb1",
                           "v_nb2", "m_off", "o_off", "flags", "n_split")),
    ("scale", "f32"), ("softcap", "f32"), ("s_off", "u32"),
    *((n, "u32") for n in ("pos_off", "ff_off", "rows_off", "qw_off", "kw_off", "ks_off", "vs_off")),
    *((n, "f32") for n in ("eps", "theta_scale", "freq_scale", "ext_factor", "corr_low", "corr_high")))


@dataclass(frozen=True)
class FANormRope:
    """What flash attention's prologue needs to do norm_rope's work (from fa_norm_rope): the raw
    queries it reads in place of the rotated ones, its defines, its 9 bindings (after the
    attention's) and push fields, and the caches it stores into."""

    q: Tensor
    defines: dict
    buffers: tuple
    push: dict
    k_cache: Tensor
    v_cache: Tensor


def fa_norm_rope(dev, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, cells: Tensor, k_cache: Tensor,
                 v_cache: Tensor, *, q_weight: Tensor | None = None, k_weight: Tensor | None = None,
                 eps: float = 0.0, rope_args: dict, k_rot: int = 0, v_rot: int = 0) -> FANormRope | None:
    """The prologue that replaces norm_rope(k, positions, k_cache, weight=k_weight, rows=cells,
    store_v=(v, v_cache), with_q=(q, q_rotated, q_weight)) for one token: q F32 [head_dim, n_head,
    1] (a strided view is fine, e.g. a gated query's half), k and v F32 [head_dim, n_kv_head, 1]
    with contiguous heads, the caches F32/F16 or a quantised KV type [head_dim, cells, n_kv_head]
    with contiguous rows (V's laid out as K's), cells I32 [1]; k_rot / v_rot as norm_rope's (the
    rows, the queries' with K's, Walsh-Hadamard rotated before they are stored; V's into a
    quantised cache only). None where the attention cannot give norm_rope's bits or
    take these operands: an attention temperature, norm sums another kernel cannot redo
    (butterfly_subgroups), more than one token, other layouts."""
    D, Dv = k.ne[0], v.ne[0]
    if (q.type is not F32 or k.type is not F32 or v.type is not F32 or q.ne[0] != D or q.ne[2] != 1
            or k.ne[2] != 1 or v.ne[1:3] != k.ne[1:3] or k.nb[1] != 4 * D or v.nb[1] != 4 * Dv
            or q.nb[0] != 4 or not all(c.type in (F16, F32) or is_quantised(c) for c in (k_cache, v_cache))
            or k_cache.nb[0] != k_cache.type.type_size or v_cache.nb[0] != v_cache.type.type_size
            or any(is_quantised(c) and c.ne[0] % c.type.block_size for c in (k_cache, v_cache))
            # IQ4_NL's quantiser (a search over scales) took the RX 580 compiler's decode attention
            # to 140 VGPRs (1 wave) against 92-96 (2) with the other types': norm_rope stores it
            or "IQ4_NL" in (k_cache.type.name, v_cache.type.name)
            or k_rot and D % k_rot or v_rot and (Dv % v_rot or not is_quantised(v_cache))
            or k_cache.ne[0] != D or v_cache.ne[0] != Dv or k_cache.ne[2] != k.ne[1] or v_cache.ne[2] != k.ne[1]
            or F16 in (k_cache.type, v_cache.type) and not dev.profile.storage_16bit
            or cells.type is not I32 or cells.nelements < 1 or (q_weight is None) != (k_weight is None)):
        return None
    (pr, fr), rope = rope_operands(k, positions, op="flash attention prologue", **rope_args)
    if rope["temp_scale"]:
        return None
    defines = {"NORM_ROPE_IN": 1, "NR_NORM": int(k_weight is not None), "NR_N_DIMS": rope["n_dims"],
               "NR_ATTN_FACTOR": f"{struct.unpack('<I', struct.pack('<f', rope['attn_factor']))[0]}u",
               **rope_flag_defines(rope)}
    if k_rot:
        defines.update(rotation_defines("K_ROT", k_rot, "flash attention prologue"))
    if v_rot:
        defines.update(rotation_defines("V_ROT", v_rot, "flash attention prologue"))
    quantised = [c for c in (k_cache, v_cache) if is_quantised(c)]
    if quantised:
        defines["KVQ_WORDS"] = kvq_words(*quantised)
    kr, ko, _ = f32_binding(k, "flash attention prologue k")
    vr, vo, _ = f32_binding(v, "flash attention prologue v")
    qwr = kwr = kr   # stand-ins where the bindings are unused
    qwo = kwo = 0
    if k_weight is not None:
        sg = dev.profile.subgroup_min
        if (butterfly_subgroups(dev, D) is None or q_weight.nelements != D or k_weight.nelements != D
                or q_weight.type is not F32 or k_weight.type is not F32):
            return None
        qwr, qwo, _ = f32_binding(q_weight, "flash attention prologue q norm")
        kwr, kwo, _ = f32_binding(k_weight, "flash attention prologue k norm")
        defines.update(NR_WG=norm_wg(dev, D), NR_SG=sg, **subgroup_defines(dev))
    rr, ro = bind_tensor(cells, "flash attention prologue cells")
    kcr, vcr = ((bind_words(c, f"flash attention prologue {n} cache", dev) if is_quantised(c)
                 else bind_tensor(c, f"flash attention prologue {n} cache"))[0]
                for c, n in ((k_cache, "k"), (v_cache, "v")))
    push = dict(pos_off=rope["pos_off"], ff_off=rope["ff_off"], rows_off=ro // 4, qw_off=qwo, kw_off=kwo,
                ks_off=ko, vs_off=vo, eps=float(eps), theta_scale=rope["theta_scale"],
                freq_scale=rope["freq_scale"], ext_factor=rope["ext_factor"], corr_low=rope["corr_low"],
                corr_high=rope["corr_high"])
    return FANormRope(q, defines, (qwr, kwr, pr, fr, rr, kr, vr, kcr, vcr), push, k_cache, v_cache)
