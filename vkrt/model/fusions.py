"""The lossless fusions a recording may use (Fusions: each switchable, VKRT_FUSE_<name>=0/1,
giving the same bits on and off; docs/ARCHITECTURE.md §4)."""

from __future__ import annotations

from dataclasses import dataclass

# Why each fusion is kept (every one is on by default and measured on the H200):
# ADD_NORM (residual add inside the next RMS norm) and NORM_ROPE (q/k norm + RoPE + K's cache
# store: 2 kernels instead of 5 a layer). GATE_UP (decode: the gate and up projections in one
# mat-vec pass with the gated activation on its output, where the loader put both weights in one
# allocation): one dispatch and one kernel fewer a layer. KV_STORE (with NORM_ROPE: V's store
# into its cache rides in K's norm_rope dispatch where V and its cache are laid out as K and its
# cache): one dispatch fewer a layer (tg128 within noise on the H200: 8B 175.2 vs 175.5 apart,
# 30B-A3B 180.3 vs 181.9). QK_ROPE (with NORM_ROPE: the queries' norm_rope in K's dispatch, not
# where they carry mistral3's temperature): 30B-A3B 276.2 vs 272.0 apart, Qwen3.5 256.3 vs
# 257.1, 8B 255.8 vs 254.2 (H200, GCN table, tg128, same run). NORM_ROUTE (decode: the residual
# add and RMS norm before a MoE block in the prologue of its router's mat-vec, each workgroup
# redoing the norm's sums in its order with every load issued at once): 30B-A3B 276.2 vs 272.3
# apart, Qwen3.5 256.3 vs 255.5 (same run); an earlier form that walked the loads one after
# another lost 5%. FA_ROPE (decode, one token: the q/k norm, RoPE and K/V cache stores in flash
# attention's prologue; the split whose tiles hold the new cell stores it and reads its K and V
# back from the caches; vkrt/ops/fa_norm_rope.py): norm_rope's dispatch and barrier gone a layer
# with no atomic and no serial tail (30B-A3B shape, tg128, vkrt bench, same run: GCN table 288.5
# against 276.0 off, native 310.1 vs 293.2; Qwen3.5 shape 261.3 vs 262.8 +- 3.9; dense 8B 271.4
# vs 269.4). RESID_NORM (decode: the summed down projection adds into the residual stream and
# its last workgroup does the next block's RMS norm into cur; the combining norm's dispatch and
# barrier gone a MoE layer) where the summed down takes a token's slots at once: NVIDIA table
# 319.5 t/s against 309.2 apart (30B-A3B shape, tg128, same call); with the GCN table on the
# H200 (its 32-wide subgroups: one group walking the slots, a row a workgroup) it lost, 220.8
# against 287.4, and is not taken there (norm_output_fits).


@dataclass(frozen=True)
class Fusions:
    """Which lossless fusions a recording uses (the Transformer's; both settings of each give
    the same bits). `Fusions.of(settings)` takes them from the VKRT_FUSE_* settings."""

    add_norm: bool
    norm_rope: bool
    gate_up: bool
    kv_store: bool = True
    combine_norm: bool = True
    route: bool = True
    norm_route: bool = True
    qk_rope: bool = True
    fa_rope: bool = True
    resid_norm: bool = True

    @staticmethod
    def of(settings) -> "Fusions":
        return Fusions(add_norm=settings.fuse_add_norm, norm_rope=settings.fuse_norm_rope,
                       gate_up=settings.fuse_gate_up, kv_store=settings.fuse_kv_store,
                       combine_norm=settings.fuse_combine_norm, route=settings.fuse_route,
                       norm_route=settings.fuse_norm_route, qk_rope=settings.fuse_qk_rope,
                       fa_rope=settings.fuse_fa_rope, resid_norm=settings.fuse_resid_norm)
