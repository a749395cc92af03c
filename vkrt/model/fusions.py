"""The lossless fusions a recording may use (Fusions: each switchable, VKRT_FUSE_<name>=0/1,
giving the same bits on and off; docs/ARCHITECTURE.md §4), and the projection helper that
applies QKV."""

from __future__ import annotations

from dataclasses import dataclass

from ..ops.matmul import matmul, matmul_segments

# The defaults are declared with the variables in vkrt/settings.py; why each is on or off:
# ADD_NORM (residual add inside the next RMS norm) and NORM_ROPE (q/k norm + RoPE + K's cache
# store: 2 kernels instead of 5 a layer) are on. GLU (the gated activation inside the down
# mat-vec) is off: the fused mat-vec redoes the activation once per row group (M / mv_rows times
# per input), which cost more than the separate kernel it saves where the weights are in VRAM
# (H200, 8-layer 30B-A3B shape, decode: 639 us fused vs 507 us separate per step;
# bench/decode_profile.py). GATE_UP (decode: the gate and up projections in one mat-vec pass
# with the gated activation on its output, where the loader put both weights in one allocation):
# one dispatch and one kernel fewer a layer. MOE_SUM (decode: the expert down projection sums a
# token's slots with the routing weights, and the shared expert's gated output, in its epilogue;
# moe_combine's pass is gone) is off: a token's rows become its only workgroups, 8x fewer than a
# workgroup per (token, slot), and on the latency-bound H200 that cost more than the pass it saves
# (Qwen3-30B-A3B shape, Q4_0 in VRAM, tg128: 120-123 t/s summed vs 137 apart, GCN and native
# tables, bench/peer.py). QKV (decode: matrices reading the same normed input -- attention's q, k
# and v, DeltaNet's qkv and gate, its alpha and beta -- in one mat-vec dispatch where they share a
# type and an allocation) is off: alone it beats the three dispatches (H200, GCN table, bench loop
# of weight copies: 8B's q/k/v 27.6 -> 19.3 us, 30B-A3B's 20.5 -> 12.3), but inside a decode step
# the three already overlap (no barrier between them) and tg128 did not move (8B 171.7 apart vs
# 170.1 fused, 30B-A3B 187.6 vs 186.6; bench/peer.py, same run). KV_STORE (with NORM_ROPE: V's
# store into its cache rides in K's norm_rope dispatch where V and its cache are laid out as K and
# its cache) is on: one dispatch fewer a layer (tg128 within noise on the H200: 8B 175.2 vs 175.5
# apart, 30B-A3B 180.3 vs 181.9). QK_ROPE (with NORM_ROPE: the queries' norm_rope in K's dispatch,
# not where they carry mistral3's temperature) is on: 30B-A3B 276.2 vs 272.0 apart, Qwen3.5
# 256.3 vs 257.1, 8B 255.8 vs 254.2 (H200, GCN table, tg128, same run). NORM_ROUTE (decode: the
# residual add and RMS norm before a MoE block in the prologue of its router's mat-vec, each
# workgroup redoing the norm's sums in its order with every load issued at once) is on: 30B-A3B
# 276.2 vs 272.3 apart, Qwen3.5 256.3 vs 255.5 (same run); an earlier form that walked the
# loads one after another lost 5%. QKV_ROPE (decode: the last workgroup to finish a head's rows
# of the q, k or v projection does that head's norm, RoPE and cache store, norm_rope's dispatch
# and barrier gone; vkrt/ops/head_epilogue.py) is off: on the H200 the atomic count, the read-back
# and the serial tail cost what the barrier did (Qwen3-30B-A3B shape, GCN table, tg128: 273.5 /
# 273.8 t/s on against 274.8 off, vkrt bench, same run). FA_ROPE (decode, one token: the q/k
# norm, RoPE and K/V cache stores in flash attention's prologue; the split whose tiles hold the new
# cell stores it and reads its K and V back from the caches; vkrt/ops/fa_norm_rope.py) is on:
# norm_rope's dispatch and barrier gone a layer with no atomic and no serial tail (30B-A3B shape,
# tg128, vkrt bench, same run: GCN table 284.6 / 284.8 t/s against 277.1 / 277.2 off, native
# 303.8 vs 293.2; Qwen3.5 shape 261.3 vs 262.8 +- 3.9; dense 8B 271.4 vs 269.4). With every
# prologue load issued at the kernel's start (not phase by phase after barriers): GCN 288.5
# against 283.5 for the first form and 276.0 off, native 310.1 against 302.7. MOE_SUM's workgroup
# now takes a token's slots at once, a group a slot, where its groups reduce in shuffle clusters
# (NVIDIA table: 310.8 t/s against 309.2 apart; it was 283.5) and walks them one row a workgroup
# where they reduce by subgroup adds (the GCN table on the H200's 32-wide subgroups: 281 against
# 287); still off. RESID_NORM (decode: the summed down projection adds into the residual stream
# and its last workgroup does the next block's RMS norm into cur; the combining norm's dispatch
# and barrier gone a MoE layer) is on where the summed down takes a token's slots at once: NVIDIA
# table 319.5 t/s against 309.2 apart (30B-A3B shape, tg128, same call); with the GCN table on
# the H200 (its 32-wide subgroups: one group walking the slots, a row a workgroup) it lost, 220.8
# against 287.4, and is not taken there (norm_output_fits). Its first form, the next block's
# projections each redoing the norm in their prologue, lost too (GCN table 233.2 against 287.3,
# NVIDIA table 280.9 against 309.2: 1280 workgroups each redoing the norm) and was not kept.


@dataclass(frozen=True)
class Fusions:
    """Which lossless fusions a recording uses (the Transformer's; both settings of each give
    the same bits). `Fusions.of(settings)` takes them from the VKRT_FUSE_* settings."""

    add_norm: bool
    norm_rope: bool
    glu: bool
    gate_up: bool
    moe_sum: bool
    qkv: bool
    kv_store: bool = True
    combine_norm: bool = True
    route: bool = True
    norm_route: bool = True
    qk_rope: bool = True
    qkv_rope: bool = False
    fa_rope: bool = True
    resid_norm: bool = True

    @staticmethod
    def of(settings) -> "Fusions":
        return Fusions(add_norm=settings.fuse_add_norm, norm_rope=settings.fuse_norm_rope, glu=settings.fuse_glu,
                       gate_up=settings.fuse_gate_up, moe_sum=settings.fuse_moe_sum, qkv=settings.fuse_qkv,
                       kv_store=settings.fuse_kv_store, combine_norm=settings.fuse_combine_norm,
                       route=settings.fuse_route, norm_route=settings.fuse_norm_route,
                       qk_rope=settings.fuse_qk_rope, qkv_rope=settings.fuse_qkv_rope,
                       fa_rope=settings.fuse_fa_rope, resid_norm=settings.fuse_resid_norm)


def project(seq, pairs, x, fused: bool) -> None:
    """(weight, output) pairs that read the same input x: one mat-vec dispatch over all their
    rows where that can be (`fused`: Fusions.qkv), else one matmul each."""
    if fused:
        matmul_segments(seq, [wt for wt, _ in pairs], x, [t for _, t in pairs])
    else:
        for wt, t in pairs:
            matmul(seq, wt, x, t)
