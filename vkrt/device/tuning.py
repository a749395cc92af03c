"""The one tuning table: architecture -> kernel parameters. No other file branches on architecture.

Each entry says why it differs from the default. Kernels read the resolved `Tuning` of their
device (`device.tuning`), never the architecture itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import UnsupportedDevice
from .architecture import Arch
from .profile import DeviceProfile


@dataclass(frozen=True)
class Tuning:
    arch: Arch
    # workgroup size of 1-D elementwise kernels (fill, add, copy, convert)
    wg_size: int = 256
    # subgroup size kernels are laid out for; the workgroup sizes below are multiples of it
    subgroup: int = 32
    # workgroup size of reductions (one workgroup reduces one row)
    reduce_wg: int = 256
    # use 16-bit float arithmetic where a kernel has such a variant (storage is separate)
    fp16_math: bool = True
    # tile edge of the shared-memory transpose
    transpose_tile: int = 32
    # tile rows a transpose workgroup moves per pass: the workgroup is transpose_tile x this
    # (32 x 8 = 256 invocations, a multiple of 64 for GCN wave64); each invocation moves
    # transpose_tile / transpose_rows elements of a tile
    transpose_rows: int = 8
    # flash attention, scalar fp32 path (vkrt/ops/flash_attn.py derives its tile from these):
    # workgroup size; lanes sharing one K row's dot product (a power of two, at most the
    # subgroup); column lanes; KV columns per tile (Bc); accumulator floats per thread (sets the
    # query rows Br from the V head size); workgroups that fill the device (a smaller grid is
    # split along KV, "split-K") and the fewest KV tiles one split gets
    fa_wg: int = 128
    # (head size, invocations) pairs in fa_wg's place for prompt-sized calls (more than
    # fa_pack_max_q queries) at that head size (K and V of it) over an f16 or f32 cache
    fa_prompt_wg_by_head: tuple = ()
    fa_d_split: int = 8
    fa_cols: int = 8
    fa_bc: int = 32
    fa_o_regs: int = 64
    # the most query rows one thread owns (registers for scores, Q and mask values grow with it)
    fa_max_rows: int = 8
    fa_fill_groups: int = 256
    # where the device says how many compute units it has: this many workgroups a unit fill it
    # instead (0: fa_fill_groups as written)
    fa_fill_per_cu: int = 0
    fa_split_min_tiles: int = 4
    # pack the query heads of a KV head into one workgroup (K/V read once per KV head) up to this
    # many queries (decode steps of up to this many sequences), at most fa_pack_rows rows a
    # thread; such decode-sized calls split along KV down to fa_decode_split_min_tiles tiles a split
    fa_pack_max_q: int = 16
    fa_pack_rows: int = 1
    # (cache type, rows a thread) pairs in fa_pack_rows' place for a K (else V) cache of that type
    fa_pack_rows_by_type: tuple = ()
    # (head size, rows a thread) pairs in fa_pack_rows' place at that head size (K and V of it),
    # for any cache type fa_pack_rows_by_type names none for
    fa_pack_rows_by_head: tuple = ()
    # the accumulator floats a thread may hold in those packed rows (0: fa_o_regs)
    fa_pack_o_regs: int = 0
    # (head size, rows a thread) pairs in place of those for an F16 or F32 cache's one-token decode
    # doing norm_rope's work in its prologue (one sequence; several sequences keep the above)
    fa_prologue_pack_rows_by_head: tuple = ()
    # the largest head size whose one-token decode attention does norm_rope's work in its prologue
    # (the fa_rope fusion; 0: any): past it norm_rope is a dispatch of its own
    fa_prologue_max_head: int = 0
    # decode-sized attention compiles a second KV loop that reads no mask, run in steps the engine
    # flags mask-zero (one sequence's decode), up to this head size (0: any)
    fa_mask_zero: bool = True
    fa_mask_zero_max_head: int = 0
    fa_decode_split_min_tiles: int = 2
    # ... and at run time each split takes at least this many of the live tiles (a short context in
    # a dispatch recorded for a longer one runs on fewer splits; one split merges nothing). H200,
    # GCN table, heads 32/4 x 128, 8 splits recorded: at 1 / 4, depth 32 11.1 / 9.1 us, depth 128
    # 12.0 / 13.4; 30B-A3B shape tg128 275.8 / 274.4 t/s
    fa_decode_split_min_live: int = 1
    # KV columns a tile for decode-sized calls (at most fa_pack_max_q queries; 0: fa_bc): the
    # shorter tiles of a short context spread over more splits. H200, GCN tuning, tg128:
    # Qwen3-30B-A3B shape 248.6 t/s at 32, 260.9 at 16, 258.9 at 8; dense 8B 201.7 / 207.1 / 205.9
    fa_decode_bc: int = 16
    # column lanes of those calls' workgroups (0: fa_cols; at most their tile's columns): the row
    # groups a workgroup keeps for a step's few rows (a KV head's query heads) are the rest of it
    fa_decode_cols: int = 0
    # (head size, dot lanes) and (head size, rows a thread) pairs for those calls over a quantised
    # K or V cache at that head size (K and V of it), in place of fa_d_split and the rows above
    # (fa_pack_rows_by_type still first): more lanes a cell's dot product and more rows a row
    # group dequantise a tile's blocks in fewer row groups. Lanes at most a subgroup
    fa_quant_decode_d_split_by_head: tuple = ()
    fa_quant_decode_rows_by_head: tuple = ()
    # decode-sized calls issue a tile's mask, K and V loads before using any (shaders/flash_attn.comp
    # LOADS_FIRST): one memory round trip a tile instead of three in a row; 2: the next tile's
    # too, while this one is computed; 0: each loaded where it is used. H200, GCN table, heads
    # 32/4 x 128, one query, split 1 at depth 4096: 520 / 305 / 189 us; Qwen3-30B-A3B shape
    # tg128 269.1 / 274.6 / 275.8 t/s (bench/flash_attn_decode.py, vkrt bench). 3: a tile's K and V
    # loaded once a workgroup into shared memory (a share a thread, the next tile's in flight), not
    # once a row group: the RX 580's compiler gives it 60 VGPRs (4 waves) against 108 (2), but on
    # the H200 the two barriers a 16-cell tile cost more than the loads saved (GCN table, heads
    # 32/4 x 128 at depth 16000: 60.6 against 52.1 us; Qwen3-30B-A3B shape tg128@d16384 150.1
    # against 169.6 t/s), so no table takes it; one to try on an RX 580 (flash_attn_decode.py --set)
    fa_loads_first: int = 2
    # (KV cache type name, LOADS_FIRST) for decode-sized calls whose K (else V) is of that type, in
    # place of fa_loads_first: 3 dequantises a quantised tile once a workgroup instead of once a
    # row group (a vec4 of an 18- or 34-byte block is 3-6 word loads)
    fa_loads_first_by_type: tuple = ()
    # 2 only where a thread's share of a tile's K and V, as stored, is at most this many bytes (0:
    # any); past it decode-sized calls take 1, which holds one tile instead of two
    fa_ahead_max_bytes: int = 0
    # unroll the tile loops (registers for the accumulators; off where compile time is the cost)
    fa_unroll: bool = True
    # the dot lanes sum a tile's scores by a reduce-scatter and all-gather (shaders/flash_attn.comp
    # dot_sums: 14 shuffles for 8 scores over 8 lanes, not 24; the same bits) instead of a
    # butterfly a score; not with LOADS_FIRST 3
    fa_dot_scatter: bool = False
    # staging ring for uploads from pageable memory: segment bytes and segment count; a few
    # segments in flight keep the DMA engine busy while the host fills the next one
    staging_segment: int = 16 << 20
    staging_segments: int = 4
    # quantised matmul (vkrt/ops/matmul.py). Up to mv_max_n tokens use the mat-vec kernel: mv_wg
    # invocations (a power of two) split the K dimension of mv_rows rows, dequantising inside the
    # dot product; decode reads each weight once, so this path is bandwidth-bound. More tokens use
    # the tiled GEMM: a workgroup computes mm_bm rows x mm_bn tokens, stepping K by mm_bk with both
    # tiles dequantised into shared memory (fp32), each invocation mm_tm x mm_tn outputs; the
    # workgroup is (mm_bm / mm_tm) * (mm_bn / mm_tn) invocations. 64 x 64 tiles with 8 x 8 per
    # invocation: 64 invocations (one GCN wave), 4 vec4 shared-memory reads per 64 FMAs per K step, and
    # enough workgroups (M / 64 * N / 64) to fill 36 CUs or 132 SMs from n = 512 on.
    mv_wg: int = 64
    mv_rows: int = 4
    mv_max_n: int = 8
    # mul_mat_id over experts in VRAM stays a mat-vec (one column a (token, slot) pair, an
    # expert's weights read once a pair) up to mv_id_max_n tokens, rather than the route table and
    # the GEMM, whose workgroup computes mm_bn (64) token columns of one expert however few pairs
    # chose it. A server step of 16 slots on Qwen3-30B-A3B (128 experts, 8 used) is 128 pairs
    # over ~81 experts, 1.6 each: the GEMM computed ~40x the live columns, and the step took 63 ms
    # on the H200 against 9 ms for 4 slots (vkrt issue 16). The mat-vec's cost grows with the
    # pairs, the GEMM's with the experts chosen; weight bytes over GEMM throughput put the
    # crossover at tens of pairs a chosen expert (~25 on the H200, ~15 on Polaris, estimated),
    # and 32 tokens keep Mixtral-like stacks (8 experts, 2 used: 8 pairs an expert) well inside
    # it. Lavapipe, a 2-layer qwen3moe of 64 experts (8 used), Q4_0, decode steps of N slots: 16
    # slots 1225 -> 470 ms (29 ms a token, as at 8), 32 slots 1406 -> 861; the GEMM ties at 64.
    # Experts in host memory take the same path (bits independent of placement): read in place,
    # the mat-vec reads a chosen expert across the bus once a pair, the GEMM once
    mv_id_max_n: int = 32
    # up to mv_chunk_n tokens a dense matmul stays a mat-vec, over runs of mv_max_n columns (the
    # weights read once a run), rather than the GEMM, whose K loop costs the same from 1 to 128
    # tokens (a server's decode step of 9-16 slots). H200, 4096x14336 Q4_K: 16 tokens 369 us as
    # two runs vs 438 the GEMM; 64 tokens 1446 vs 498
    mv_chunk_n: int = 16
    # the most token columns a dense mat-vec run takes, fused (gate and up in one pass, the gated
    # activation on its output) or not: more columns run in several runs, gate/up's too; the
    # router's routing and norm stop there (mul_mat_id's mat-vec is one column a token-slot pair:
    # mv_max_n)
    mv_dense_max_n: int = 8
    # mat-vec units of types that allow it (Q4_K, Q5_K) load their 16 bytes in one load where the
    # weights are 16-byte aligned, instead of four word loads, and their block headers too; not
    # the types in mv_narrow_types (their word loads take fewer registers)
    mv_wide: bool = True
    mv_narrow_types: tuple = ()
    # the IQ quants' lookup grids (up to 8 KiB) read from shared-memory copies each workgroup
    # fills first, instead of from the constant arrays (shaders/quant/iq_common.glsl). On where a
    # compiler handles a dynamically indexed constant array badly: NVIDIA (H200, 4096x14336
    # mat-vec, constant arrays vs shared copies: IQ2_XXS 343 -> 230 us, IQ2_S 1730 -> 144, IQ1_S
    # 1133 -> 148, IQ1_M 782 -> 148, IQ3_S 235 -> 288; an 8B-shaped IQ2_XXS decode 20.3 -> 116.9
    # t/s; bench/matmul.py, bench/peer.py) and lavapipe (LLVM lowers each read to a search: an
    # IQ2_XXS mat-vec took 20 s to build, 1 s from shared copies). Off on GCN: ACO reads constant
    # arrays from memory, and the 8 KiB copies left IQ1/IQ2_S expert mat-vecs at 2 waves a SIMD
    # (112-128 VGPRs) instead of 4 (bench/gcn_shader_stats.py)
    quant_tables_shared: bool = False
    # the shared copies filled from a device buffer holding the grids (16-byte loads, a share an
    # invocation; vkrt/pipeline/quant_tables.py) instead of every invocation storing the whole
    # table with constant indices (2 KiB of stores an invocation for IQ2_XXS's grid). NVIDIA
    # serialised the lanes' reads when they were filled a share an invocation from the constant
    # array instead: H200, 4096x14336 mat-vec, IQ2_S 78.0 us, IQ1_S 75.1, IQ2_XXS 41.3 that way,
    # 38.1 / 32.2 / 38.5 with no fill at all (wrong sums: the fill's whole cost), 39.7 / 33.6 /
    # 38.4 from the buffer (bench/matmul.py); 8B-shaped decode, GCN table + shared tables, IQ2_S
    # 108.5 -> 191.5 t/s, IQ1_S 110.8 -> 201.9 (bench/peer.py). GCN keeps the constant arrays (see
    # quant_tables_shared); with the buffer, IQ2_XXS / IQ3_XXS would keep their waves there
    quant_tables_buffer: bool = False
    # the 16-entry codebook of IQ4_NL, IQ4_XS and MXFP4 read from a shared copy (four shared reads
    # a vec4) instead of picked out of a uvec4 in registers (three selects, a shift and a sign
    # extension an element): H200, 8B-shaped IQ4_XS tg128 103.9 -> 173.1 t/s with the GCN table
    # (llama.cpp 160.6), 103.4 -> 174.2 native (bench/peer.py). On GCN the selects would cost
    # ~5 VALU an element where 256 GB/s brings ~10 elements a clock to a CU's 64 lanes; a shared
    # read is one LDS access (ACO: 0 spills, bench/gcn_shader_stats.py)
    quant_codebook_shared: bool = True
    # (type name, rows) where a weight type's mat-vec takes fewer rows a group than mv_rows (its
    # per-row state costs registers: GCN keeps 4 waves a SIMD)
    mv_rows_by_type: tuple = ()
    # the same for a mat-vec of one token column only (decode of one sequence, mul_mat_id's pairs,
    # the summed expert down projection): a run of several columns keeps mv_rows_by_type's rows
    mv_rows_one_column_by_type: tuple = ()
    # the most rows a group of a dense mat-vec run of several token columns takes (a server's
    # decode step, a verify step; 0: as for one column): its accumulators grow with rows x columns
    mv_rows_multi: int = 0
    # the most elements of x + r (over the columns) a lane of the router's mat-vec holds for the
    # add and norm in its prologue (matmul's norm_in): past it the norm is a dispatch of its own
    mv_norm_max_held: int = 32
    # the summed expert down projection (the resid_norm fusion): a workgroup's groups take a token's
    # slots at once, a group a slot, up to mv_sum_slots of them (0: as many as the workgroup
    # holds); a group walks any slots past those one at a time, unrolled with mv_sum_unroll
    mv_sum_slots: int = 0
    mv_sum_unroll: bool = False
    # mat-vec units a lane loads before it uses them (the unit loop unrolled): a short mat-vec
    # on a wide GPU is bound by load latency, not bandwidth
    mv_unroll: int = 1
    # mul_mat_id's mat-vec workgroup (0: mv_wg); a mat-vec's rows a group are halved (down to
    # one) while its grid has fewer workgroups than mv_fill_groups (short matrices: more
    # workgroups in flight rather than x reused across more rows)
    mv_id_wg: int = 0
    mv_fill_groups: int = 256
    # a dense mat-vec (mul_mv) of many rows takes fewer lanes a row (halved, down to a subgroup,
    # the workgroup with them) while its grid keeps mv_lanes_threads invocations (rows / mv_rows x
    # lanes; 0: never): a lane then dots more units of its row, and the lanes' sums (shuffles or
    # subgroup adds of rows x columns values) are a smaller part of the work. Decided by the
    # matrix alone, so one column and a run of several sum a row alike
    mv_lanes_threads: int = 0
    # mat-vecs sum a row's lanes by a reduce-scatter (shaders/mv_reduce.glsl MV_SCATTER: for V
    # values a lane, about V shuffles where a butterfly a value takes V x log2(lanes)): where the
    # lanes lie within a subgroup, in place of the butterfly (the same bits); where they are whole
    # subgroups of one fixed size, in place of subgroup adds (the same sums for any count of
    # columns, so a run of columns keeps each column's bits)
    mv_sum_scatter: bool = False
    mm_bm: int = 64
    mm_bn: int = 64
    mm_bk: int = 16
    mm_tm: int = 8
    mm_tn: int = 8
    # split-K for short GEMMs: at most mm_split_max_tiles token tiles (mm_bn) and fewer tiles
    # than mm_split_groups workgroups (mm_split_fill_per_cu a compute unit where the device says
    # how many it has; 0: never): K is cut into at most mm_split_max ranges of at least
    # mm_split_min_steps BK steps, a workgroup each, and split_sum.comp adds their partial tiles
    # in order. A server's mixed step of 64 tokens on an 8B model ran 64 workgroups for 4096-row
    # matrices and 16 for 1024-row ones, each walking all of K. 8 a compute unit: a GCN CU holds
    # 8 of these 64-invocation GEMM workgroups (2 waves a SIMD at ~110 VGPRs); on the H200 a
    # mixed step of 4 decode + 60 prompt tokens (dense 8B) took 104.6 ms unsplit, 56.6 at 2 a
    # compute unit, 51.6 at 4, 47.0 at 8; 128 tokens 133.2 / 96.8 / 91.6 / 88.9
    mm_split_fill_per_cu: int = 8
    mm_split_groups: int = 0
    mm_split_min_steps: int = 16
    mm_split_max: int = 8
    mm_split_max_tiles: int = 4
    # the GEMM on cooperative matrices (VK_KHR_cooperative_matrix, 16x16x16 fp16 products into
    # fp32) where the device has them: both tiles stored in shared memory as fp16, each subgroup
    # computing mm_cm_wm x mm_cm_wn of the tile; the tile becomes mm_cm_bm x mm_cm_bn x mm_cm_bk
    # (resolved()). Not bit-identical to the fp32 GEMM: its operands are rounded to fp16, as in
    # llama.cpp's coopmat GEMM
    mm_coopmat: bool = False
    mm_cm_bm: int = 64
    mm_cm_bn: int = 64
    mm_cm_bk: int = 32
    mm_cm_wm: int = 32
    mm_cm_wn: int = 32
    # prompt flash attention on cooperative matrices (shaders/flash_attn_cm.comp: fp16 Q, K, V
    # and probabilities, fp32 sums) from fa_cm_min_q queries; fewer (decode steps, short
    # chunks) keep the scalar fp32 kernel with its packed heads and KV splits. Same device needs
    # as mm_coopmat; VKRT_COOPMAT switches both
    fa_coopmat: bool = False
    fa_cm_min_q: int = 32
    # the largest head size (of K and V) whose prompt attention takes that kernel by itself (0:
    # any); larger heads keep the scalar kernel unless a caller forces the other
    fa_cm_max_head: int = 0
    # a wider fp32 GEMM tile (0: none) for products whose token columns overflow one token tile
    # of mm_bn: a dense GEMM of more than mm_bn tokens (kernel_columns), mul_mat_id whose experts
    # average mm_bn pairs or more (their counts spread around the mean: at a mean of mm_bn about
    # half need two narrow tiles). Narrower products keep mm_bm x mm_bn (a wide tile over a few
    # columns computes mostly padding). H200, GCN table, 128 x 128 against 64 x 64 (split-K as
    # the rules give; bench/matmul.py): dense 4096x4096 Q4_K, 32 / 64 / 96 tokens 144.5 / 148.7
    # / 153.8 us against 100.7 / 105.1 / 214.7; Qwen3.5-35B-A3B's experts (2048x512, 256 of
    # them, 8 used) at 2048 tokens, 64 pairs an expert, Q4_0 / Q4_K 2302 / 2224 us against
    # 2490 / 2439. The sums are the same either way: a tile adds K in BK steps in order
    mm_big_bm: int = 0
    mm_big_bn: int = 0
    # decode with experts in host memory: copy the chosen experts into device slots with wide
    # loads first (vkrt/ops/moe_stage.py) rather than let the mat-vecs read host memory in place,
    # except for these weight types. H200, PCIe 5, 8 of 128 experts of 2048x768 per stack
    # (bench/moe_decode.py): Q4_0 in place 47.4 GB/s, staged 43.7 (the link's peak is ~50);
    # Q4_K in place 34.5 GB/s, staged 43.2 -- K-quant blocks are read in narrower pieces.
    moe_read_in_place: tuple = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
    # short convolution (vkrt/ops/ssm_conv.py): tokens of one sequence an invocation walks with its
    # K-tap window in registers; each chunk re-reads the K-1 inputs before it (3/16 more reads at
    # K = 4), and a prefill of T tokens runs C * T / chunk invocations. H200, C = 8192 (either
    # tuning): T = 2048 in 51-54 us at 8-64 tokens (2.6 TB/s of x and out), 80 at 128, 892 at one
    # chunk a sequence; T = 512: 12.4 us at 16, 14-15 at 8 or 32, 21 at 64
    ssm_conv_chunk: int = 16
    # gated delta rule (vkrt/ops/delta_net.py), recurrent form (decode): gdn_wg invocations a
    # workgroup; lanes of them share gdn_rows rows of a head's state, each lane holding
    # gdn_lane_vec4s vec4s of every row in registers (lanes read consecutive 16 bytes; lanes =
    # head_dim / 4 / gdn_lane_vec4s within a subgroup, 1 = no shuffles) and adding partial dot
    # products with subgroup shuffles: one reduction of 3 + 2 * gdn_rows values a token. H200,
    # Hv 32, D 128: every lanes (4..32) x wg x rows choice within 10% at one token (7 us) and 16
    # sequences (18 us, 3.7 TB/s of state) but 32 lanes (45% slower at 16 sequences). Null
    # Polaris device, D 128: 80 VGPRs (3 waves); 8 vec4s a lane at D 256 took 144 (1 wave)
    gdn_wg: int = 128
    gdn_lane_vec4s: int = 4
    gdn_rows: int = 1
    # chunked form (prefill): tokens a chunk (16, 32 or 64; the chunk's C x C inverse lives in
    # shared memory); the per-chunk pass's workgroup (Gram matrices and the triangular inverse,
    # at most chunk^2 / 4); the state walk's workgroup and the state floats each of its
    # invocations updates (rows a workgroup walks = gdn_scan_wg * gdn_scan_state / head_dim).
    # H200, D 128, one 2048-token sequence: chunk 32 720 us, 64 750 us (its pass 1 costs 2.4x);
    # walk of 128 invocations x 16 floats (16 rows) 720 us, 64 x 32 (16 rows) 800 us, 4-row
    # blocks 1.7-2.1 ms. On the null Polaris
    # device chunk 32 with 128 x 16 takes 72 VGPRs and 14.8 KiB of LDS in the walk (3 waves)
    gdn_chunk: int = 32
    gdn_prep_wg: int = 256
    gdn_scan_wg: int = 128
    gdn_scan_state: int = 16
    # delta_net(chunked=None) takes the chunked form from gdn_chunk_min_tokens tokens a sequence
    # and up to gdn_chunk_max_seqs sequences: the recurrent form's parallelism grows with the
    # sequences. H200, Hv 32, D 128, recurrent vs chunked: one sequence of 64 tokens 38 vs 48 us,
    # 128 69 vs 67, 256 127 vs 107, 512 232 vs 190, 1024 580 vs 369, 2048 700-770 vs 720; 4
    # sequences of 128 197 vs 193, of 512 458 vs 637; 16 of 32 196 vs 242
    gdn_chunk_min_tokens: int = 128
    gdn_chunk_max_seqs: int = 1
    # unroll the chunked kernels' loops over staged columns and tokens (off where compile time is the cost)
    gdn_unroll: bool = True

    def resolved(self, profile: DeviceProfile, coopmat: bool | None = None) -> "Tuning":
        """The table entry limited by what the device can actually do; `coopmat` (VKRT_COOPMAT)
        forces the cooperative-matrix GEMM and flash attention on or off, None leaves them to
        the table."""
        wg = min(self.wg_size, profile.max_workgroup_invocations)
        lacks = [what for what, has in (("fp16 math", self.fp16_math and profile.fp16_math),
                                        ("16x16x16 fp16 cooperative matrices", profile.coopmat_f16),
                                        ("the Vulkan memory model", profile.memory_model),
                                        ("one subgroup size", profile.subgroup_min == profile.subgroup_max))
                 if not has]
        if coopmat and lacks:
            raise UnsupportedDevice(f"VKRT_COOPMAT=1: {profile.name} ({self.arch.value} tuning) lacks {', '.join(lacks)}")
        fa_coopmat = (self.fa_coopmat if coopmat is None else coopmat) and not lacks
        coopmat = (self.mm_coopmat if coopmat is None else coopmat) and not lacks
        tile = dict(mm_bm=self.mm_cm_bm, mm_bn=self.mm_cm_bn, mm_bk=self.mm_cm_bk) if coopmat else {}

        def dot_lanes(d: int) -> int:   # flash attention's dot lanes: shuffles within a subgroup
            return min(d, profile.subgroup_min) if profile.subgroup_shuffle else 1
        return dataclasses.replace(
            self, mm_coopmat=coopmat, fa_coopmat=fa_coopmat, **tile,
            wg_size=wg,
            reduce_wg=min(self.reduce_wg, profile.max_workgroup_invocations),
            transpose_rows=max(1, min(self.transpose_rows, profile.max_workgroup_invocations // self.transpose_tile)),
            fp16_math=self.fp16_math and profile.fp16_math,
            fa_wg=min(self.fa_wg, profile.max_workgroup_invocations),
            fa_fill_groups=(self.fa_fill_per_cu * profile.compute_units if self.fa_fill_per_cu and profile.compute_units
                            else self.fa_fill_groups),
            fa_d_split=dot_lanes(self.fa_d_split),
            fa_quant_decode_d_split_by_head=tuple((h, dot_lanes(d)) for h, d in self.fa_quant_decode_d_split_by_head),
            mm_split_groups=(self.mm_split_fill_per_cu * profile.compute_units
                             if self.mm_split_fill_per_cu and profile.compute_units else self.mm_split_groups),
        )


TABLE: dict[Arch, Tuning] = {
    # Polaris/GCN: wave64 (min = max = 64) so every workgroup is a multiple of 64; RADV reports
    # shaderFloat16 = 0 and the hardware has no packed fp16 math: all arithmetic in fp32.
    # Reductions at 1024 invocations: a decode step's norms are one workgroup a row, and their
    # time is the round trips an invocation makes (a 2048 row: 2 at 1024, 8 at 256)
    Arch.AMD_GCN: Tuning(Arch.AMD_GCN, wg_size=256, subgroup=64, reduce_wg=1024, fp16_math=False,
                         # flash attention: 4 waves a workgroup (a wave per row group where the
                         # head size is a multiple of 32: 8 dot x 8 column lanes); 36 CUs
                         # (RX 580) at two workgroups each fill the card. At most 2 rows a
                         # thread: ACO gives the head-128 prefill kernel 208 VGPRs at 4 rows (1
                         # wave per SIMD), 84 at 2 (3 waves; bench/gcn_shader_stats.py)
                         fa_wg=256, fa_fill_groups=72, fa_fill_per_cu=2, fa_max_rows=2, fa_split_min_tiles=8,
                         # prompts at head 256: 8 row groups (16 x 32 tiles), at the 128 VGPRs / 2 waves the
                         # 256-invocation tile takes; each KV tile serves twice the rows. H100, heads 16/2,
                         # pp2048 at depth 16384, mask_opt off / on: 76.78 / 56.45 -> 61.05 / 45.51 ms; the
                         # Qwen3.5-35B-A3B shape's pp2048@d16384 against Polaris-class llama.cpp 0.89x -> 0.97x
                         # (1855.6 -> 2012.1 t/s). Head 128 lost (58.87 / 49.67 -> 61.00 / 51.58), decode
                         # keeps 256 (wg 512: 116 VGPRs, 2 waves, against 84, 3), and quantised caches too
                         # (ACO caps a 512-invocation workgroup at 128 VGPRs: iq4_nl spills 2; untimed)
                         fa_prompt_wg_by_head=((256, 512),),
                         # decode keeps fa_decode_bc 16 (a 16-cell K/V tile a tile ahead in registers,
                         # fa_loads_first 2) below 4 waves: one query's grid is 2 workgroups of 4 waves a CU
                         # (fa_fill_per_cu), 2 waves a SIMD, all held at once at 2; and the 4-wave variants were
                         # slower on the H200 (heads 32/4 x 128, one query, depth 16000: 60.6 us with fa_loads_first
                         # 3, 66.9 with 1, against 52.1; with 0 at depth 4096, one split, 520 against 189). ACO,
                         # VGPRs (waves) at head 64 / 128 / 256 with fa_ahead_max_bytes below (gcn_shader_stats.py --kv
                         # all; docs/results/2026-12-06-rx580-decode-attention-compiler.md): f16 64 (4) / 108 (2) /
                         # 128 (2); f32 96 (2) / 84 (3) / 128 (2); quantised 64-84 (3-4) / 88-100 (2) / 84-120
                         # (2-3), kept as the words loaded; no spills. 8-cell tiles (fa_decode_bc=8): f16 48 (5) /
                         # 72 (3) / 124 (2), q8_0/q4_0/q4_1 48-52 (4-5) / 64 (4) / 80-96 (2-3), q5_0/q5_1/iq4_nl
                         # 52-64 (4) / 68-76 (3) / 88-92 (2); and f16's head-128 tile is 18 loads, past the 15 a
                         # GCN wave can wait on one by one, so ACO waits for the next tile's first loads before this
                         # tile's arithmetic (8 cells: 9 loads). Not taken: on the H200 (this table) 8-cell tiles
                         # ran tg128 258.9 against 260.9 t/s (Qwen3-30B-A3B shape) and 205.9 against 207.1 (dense
                         # 8B); the RX 580's side is unmeasured (to try: flash_attn_decode.py --kv f16,q8_0 --set
                         # fa_decode_bc=8). A thread's tile share past 128 bytes (f16 at head 256, f32 from 128,
                         # q8_0 at 256) held twice took ACO 136-256 VGPRs, 1 wave (f32 at head 256 spilled 59):
                         # those hold one tile (fa_loads_first 1: 56-128 VGPRs, 2-4 waves; H200, f16, heads 16/2 x
                         # 256, one query, depth 16000: 75.6 against 75.4 us)
                         fa_ahead_max_bytes=128,
                         # a quantised K/V tile dequantised once a workgroup into shared memory, a thread's
                         # share whole blocks held as the words loaded: H100, this table, heads 32/4 x 128 and
                         # 16/2 x 256, one query, depth 16000, q8_0, the tile dequantised a vec4 a thread: 77.7
                         # -> 65.1 and 443.9 -> 97.8 us (f16 keeps 2: 55.2 against 63.2 and 69.9 against 67.9;
                         # flash_attn_decode.py --set); block shares unmeasured there. ACO, VGPRs (waves) at
                         # head 64 / 128 / 256: 48-60 (4-5) / 60-68 (3-4) / 76-84 (2), no spills, against 64-84
                         # (3-4) / 88-100 (2) / 84-120 (2-3) held a tile ahead (gcn_shader_stats.py --kv all)
                         fa_loads_first_by_type=(("Q8_0", 3), ("Q4_0", 3), ("Q4_1", 3), ("Q5_0", 3), ("Q5_1", 3),
                                                 ("IQ4_NL", 3)),
                         # ... and 2 rows a thread there (the 8 heads of a KV head one workgroup, which
                         # dequantises the tile once where two did): H100, this table, q8_0, one query, depth
                         # 16000: heads 32/4 x 128 62.9 -> 49.1 us, 16/2 x 256 95.7 -> 79.7. ACO, with V rotated
                         # back in the kernel: 76-84 (3) / 92-100 (2) VGPRs (waves) at head 64 / 128 against 60
                         # (4) / 68 (3) at one row, no spills; the RX 580's side is unmeasured
                         # (flash_attn_decode.py --set fa_pack_rows_by_type=none). Head 256 keeps 1
                         # (fa_pack_o_regs: 32 floats of O a thread): 2 rows held 64, and ACO took q8_0 to 132
                         # VGPRs (1 wave; 76-84, 2 waves, at one row)
                         fa_pack_rows_by_type=(("Q8_0", 2), ("Q4_0", 2), ("Q4_1", 2), ("Q5_0", 2), ("Q5_1", 2),
                                               ("IQ4_NL", 2)),
                         # F16 at head 128 takes 2 rows where the attention does norm_rope's work (one
                         # sequence's decode): H100, this table, heads 32/4 x 128, one query, depth 16000, K
                         # and V from memory (flash_attn_decode.py --cold 256): 67.4 -> 56.9 us (57.6 -> 53.3
                         # without the prologue); Qwen3-30B-A3B shape tg128@d16384 153.8 -> 166.4 and 157.3 ->
                         # 172.6 t/s (two calls, order swapped; VKRT_TUNE=fa_pack_rows=2). ACO: 128 VGPRs (2
                         # waves) against 116 (2). Not elsewhere: without the prologue (several sequences'
                         # decode, verify steps) ACO took head 128 to 160 VGPRs (1 wave), and head 64 to 84
                         # (3 waves, against 64, 4)
                         fa_prologue_pack_rows_by_head=((128, 2),),
                         fa_pack_o_regs=32,
                         # mat-vec: ACO gives Q3_K/Q5_K/Q6_K 84-128 VGPRs at 4 rows (2-3 waves),
                         # 64 at 2 (4 waves; bench/gcn_shader_stats.py)
                         mv_rows_by_type=(("Q3_K", 2), ("Q5_K", 2), ("Q6_K", 2)),
                         # Q2_K / Q4_K one column at 2 rows: ACO 64 VGPRs (4 waves) against 84 (3)
                         # at 4. H200, this table, tg128 (bench/peer.py, same calls): dense 8B
                         # Q4_K 257.2-257.7 against 258.9-260.2 t/s, 176.2 against 176.6 at depth
                         # 16384. Their runs of 4 columns keep 4 rows: at 2 an 8B Q4_K decode step
                         # of 2 / 4 slots took 6.9 / 11.9 ms against 5.8 / 8.4 (server_steps.py)
                         mv_rows_one_column_by_type=(("Q2_K", 2), ("Q4_K", 2)),
                         # Q5_K's wide loads hold its high bits' 16 bytes as well: ACO 80 VGPRs
                         # (3 waves) against 64 (4) with word loads
                         mv_narrow_types=("Q5_K",),
                         # GEMM tiles of 128 x 128 where the columns fill them (4 waves of 8 x 8
                         # outputs an invocation): half the weight loads and dequantisation a FLOP
                         # of 64 x 64; ACO 100-104 VGPRs (108-112 at 64 x 64; 2 waves either way),
                         # 17 KiB LDS, no spills. H200, this table, Q4_0 n=2048 (bench/matmul.py):
                         # 2048x4096 22.1 -> 30.0 TFLOP/s, experts 2048x768 128e/8 17.0 -> 19.7;
                         # 64 x 128 26.5 / 19.1, 128 x 64 23.6 / 18.9
                         mm_big_bm=128, mm_big_bn=128,
                         # 2 waves a row for dense mat-vecs, one for the experts' short rows;
                         # 36 CUs: about 7 workgroups a CU before rows a group are halved
                         mv_wg=128, mv_id_wg=64, mv_fill_groups=256, mv_unroll=2,
                         # dense mat-vecs in runs of 4 columns: a lane holds x for every column
                         # (and the gate/up pass two rows' sums): ACO gives Q4_K 256 VGPRs (1
                         # wave a SIMD) at 8; on the H200 (this tuning) an 8B Q4_K decode step of
                         # 8 / 16 slots took 54.9 / 48.5 ms in runs of 8, 23.3 / 41.8 in runs of 4
                         # (bench/server_steps.py)
                         mv_dense_max_n=4,
                         # a row's lanes summed by a reduce-scatter (one wave: the butterfly's bits):
                         # RX 580 compiler, fewer instructions nearly everywhere (4 columns: Q4_0 over
                         # 2 waves 1914 -> 1647, Q4_K 3228 -> 3045, Q8_0 1887 -> 1622), no kernel
                         # below 3 waves (IQ4_XS / Q2_K experts 64 -> 48 VGPRs, 4 -> 5 waves);
                         # H100 with this table (bench/speculative.py, Qwen3.5-35B-A3B shape in VRAM):
                         # decode step 4.63 -> 4.49 ms, verify k = 2 / 4 / 8 5.49 / 7.60 / 11.48 ->
                         # 5.25 / 6.79 / 10.08 ms
                         mv_sum_scatter=True,
                         # delta rule decode, head 128: 16 lanes a row (2 vec4s each): ACO 48
                         # VGPRs, 5 waves; 8 lanes (4 vec4s): 80 VGPRs, 3 waves
                         gdn_lane_vec4s=2),
    # RDNA runs wave32 natively but kernels stay correct at 64.
    Arch.AMD_RDNA1: Tuning(Arch.AMD_RDNA1, subgroup=32),
    Arch.AMD_RDNA2: Tuning(Arch.AMD_RDNA2, subgroup=32),
    Arch.AMD_RDNA3: Tuning(Arch.AMD_RDNA3, subgroup=32),
    # 132 SMs (H200), 4 workgroups each. Mat-vec (bench/matmul.py, H200, Q4_0/Q4_K/Q6_K decode
    # shapes): 128 lanes a row halve the time of 512-4096-row matrices against 64 (2048x4096
    # Q4_0 22 -> 11 us); mul_mat_id at 32 lanes (Qwen3-30B-A3B down 14.8 -> 9.3 us)
    Arch.NVIDIA: Tuning(Arch.NVIDIA, subgroup=32, reduce_wg=1024, fa_fill_groups=512, fa_fill_per_cu=4,
                        # shared tables filled a share an invocation (then from the constant arrays):
                        # 8B-shaped decode (GCN table + shared tables) IQ2_XXS 117.2 -> 140.6 t/s,
                        # IQ3_XXS 126.8 -> 143.1 against every invocation storing every entry
                        quant_tables_shared=True, quant_tables_buffer=True,
                        # GEMM on cooperative matrices, 128 x 256 tiles of 8 subgroups of 64 x 64
                        # (bench/matmul.py, Q4_K n=2048, TFLOP/s dense 4096x14336 / MoE 2048x768
                        # 128e/8): fp32 GEMM 37.9 / 24.3; coopmat 64x64 tiles of 32x32 32.4 / 21.9,
                        # 128x128 of 64x32 55.5 / 29.3, of 64x64 82.7 / 32.7, 256x128 76.3 / 44.1,
                        # 128x256 (8 subgroups) 87.4 / 45.7; prefetch lost 10-20% with every tile.
                        # pp2048 with 128x128 / 128x256: 8B-shaped Q4_K 4582 / 4588 t/s (fp32
                        # attention, vkrt bench); 30B-A3B shape 8257 (vkrt bench) / 8437 (peer.py)
                        # prompt flash attention on them: 8B-shaped Q4_K pp2048, the 32 layers'
                        # attention 93.8 -> 53.1 ms (bench/decode_profile.py), 4588 -> 5132 t/s
                        # head 256's tile that fits (32 x 32, 2 subgroups) lost to the scalar kernel once
                        # that had fa_dot_scatter (H100, pp2048 at depth 16384, bench/flash_attn.py
                        # --kv f16,q8_0, mask_opt on: f16 43.75 against 31.21 ms, q8_0 94.15 against
                        # 94.65; head 128 23.27 against 30.68 and 34.04 against 66.58)
                        mm_coopmat=True, mm_cm_bm=128, mm_cm_bn=256, mm_cm_wm=64, mm_cm_wn=64, fa_coopmat=True,
                        fa_cm_max_head=128,
                        mv_sum_unroll=True, mv_wg=128, mv_id_wg=32, mv_fill_groups=512, mv_unroll=2, mv_dense_max_n=4,
                        # no mv_lanes_threads: fewer lanes a row (65536) won in bench/matmul.py (Q4_0
                        # 2048x8192, 1 / 4 / 8 columns 11.8 / 23.8 / 46.8 -> 11.3 / 16.9 / 32.5 us) and on the
                        # dense 8B (tg128 247.5 -> 254.1 t/s) but lost on the Qwen3.5-35B-A3B shape, the users'
                        # model (tg128 274.4 -> 269.1, decode step 4.55 -> 4.73 ms; H100, tune_ab.py, 2 rounds)
                        # a row's 4 subgroups summed by a reduce-scatter, not subgroupAdd (H100,
                        # bench/speculative.py, Qwen3.5-35B-A3B shape in VRAM): decode step 4.57 -> 4.48 ms,
                        # verify k = 2 / 4 / 8 5.36 / 7.24 / 10.86 -> 5.13 / 6.48 / 9.61 ms; the experts'
                        # 32-lane clusters too (the butterfly's bits): 4.51 -> 4.43 ms, k = 2 / 4 / 8
                        # 5.17 / 6.55 / 9.72 -> 5.07 / 6.48 / 9.54 ms. One run of 8 columns
                        # (mv_dense_max_n=8) did not gain over two of 4: k = 8 9.67 ms
                        mv_sum_scatter=True,
                        # decode at head 128 with 2 rows a thread: a KV head's 8 query heads one
                        # workgroup (K and V read once a KV head, not by 4 workgroups). H100, heads
                        # 32/4 x 128, one query, 16000 cells from memory (flash_attn_decode.py --cold
                        # 256), us: f16 54.5 -> 47.3, q8_0 76.4 -> 59.6. Head 256 keeps 1 (2 rows: f16
                        # 49.6 -> 79.6, q8_0 75.9 -> 102.9); 4 or 8 rows a thread, 64 or 256 invocations
                        # or 16 dot lanes all lost (60.1-96.7 at head 128 f16)
                        fa_pack_rows_by_head=((128, 2),),
                        # a quantised cache's decode at head 128: 16 dot lanes and 4 rows a thread (a
                        # tile's blocks dequantised by one row group, not two). H100, heads 32/4 x 128,
                        # one query, q8_0, 16000 / 32000 cells from memory, with norm_rope's work (the
                        # model's kernel), us: 60.3 -> 56.3 / 92.2 -> 83.1 (heads 32/8: 60.9 -> 59.8 /
                        # 92.6 -> 84.6); Qwen3-30B-A3B shape tg128 @ d16384 q8_0 168.7 / 167.1 -> 175.0 /
                        # 174.9 t/s (interleaved). Not F16: 47.3 -> 47.1 / 69.0 -> 69.8 us, tg128 215.9 /
                        # 216.6 -> 212.4 / 212.4 t/s. The other quantised types take it unmeasured
                        fa_quant_decode_d_split_by_head=((128, 16),), fa_quant_decode_rows_by_head=((128, 4),),
                        # head 256 runs norm_rope apart: every split workgroup norms and rotates 8
                        # query rows of 256 in the prologue (H100, one query, 16000 cells from memory,
                        # us: f16 49.9 -> 76.0 with it, q8_0 76.2 -> 85.0). Qwen3.5-35B-A3B shape,
                        # tg128 @ d16384 (vkrt bench, 3 runs interleaved): f16 227.1 fused against
                        # 235.1 apart, q8_0 214.5 both; head 128 (Qwen3-30B-A3B shape, 1 run) keeps it:
                        # f16 193.9 / 189.1, q8_0 149.5 / 146.3
                        fa_prologue_max_head=128,
                        # a step flagged mask-zero runs a KV loop that reads no mask (a second copy
                        # compiled in; H100, one query, 16000 / 32000 cells from memory, us): head 128
                        # f16 46.8 -> 42.0 / 71.3 -> 62.3, q8_0 59.7 -> 53.5 / 95.8 -> 85.6; Qwen3-30B-A3B
                        # shape tg128 @ d16384 f16 191.8 -> 199.8, q8_0 148.5 -> 157.5 t/s (2 runs each).
                        # Not at head 256: f16 49.7 -> 63.4 / 74.3 -> 96.3 (q8_0 76.0 -> 71.4); Qwen3.5-35B-A3B
                        # shape f16 233.1 -> 226.6, q8_0 210.4 -> 211.2
                        fa_mask_zero_max_head=128,
                        # decode attention's dot lanes by a reduce-scatter (H100, one query, 16000 cells
                        # from memory, us, f16 / q8_0): head 128 60.7 -> 54.5 / 80.1 -> 76.5, head 256
                        # 53.6 -> 50.1 / 77.8 -> 75.7; with norm_rope's work 69.9 -> 63.6 (head 128 f16)
                        fa_dot_scatter=True,
                        fa_split_min_tiles=8),
    Arch.INTEL: Tuning(Arch.INTEL, subgroup=16, wg_size=128, reduce_wg=128),
    # lavapipe: a CPU; subgroup 8 (AVX2 lanes), small workgroups keep its threads busy.
    # Flash attention: no subgroup shuffles (a whole dot product per thread ran fastest), loops
    # left rolled (LLVM took 3-60 s per unrolled variant), split-K only below 8 workgroups.
    # Transpose: 32 x 2 workgroups; llvmpipe splits a workgroup's invocations at every barrier,
    # so fewer, longer invocations win (4096 x 512 f32: 2 rows 49 ms, 8 rows 75 ms, 32 rows 182 ms).
    Arch.LLVMPIPE: Tuning(Arch.LLVMPIPE, subgroup=8, wg_size=64, reduce_wg=64,
                          fa_wg=64, fa_d_split=1, fa_o_regs=128, fa_fill_groups=8, fa_unroll=False,
                          # decode: splits only add merges (depth 600, 4 query heads: unsplit 11.6 ms,
                          # 4 splits 13.3 ms; bench/flash_attn_decode.py --quick)
                          fa_decode_split_min_tiles=64, fa_decode_bc=0,
                          # decode: 32 column lanes, 2 row groups (the table's 8 row groups left most of
                          # a one-sequence step's 2-4 rows idle). Depth 2000, one query, ms (two runs;
                          # bench/flash_attn_decode.py): heads 9/3 x 64 29.2-30.9 -> 9.1-11.6, 8/1 x 64
                          # 6.1-6.9 -> 3.7-4.0, 32/8 x 128 47.9-49.6 -> 28.6-28.8; SmolLM2 tg16@d1024
                          # 1.21-1.25 -> 1.82-2.02 t/s. Four sequences: 9/3 29.5-31.6 -> 29.4-32.2, 8/1
                          # 12.1-12.3 -> 15.9-17.1, 32/8 106.9-110.1 -> 114.4-116.5 (16 lanes: 19.2-19.6,
                          # 15.1-19.0, 105.8-108.7 there, but 17.2-19.6 for 9/3's one sequence)
                          fa_decode_cols=32,
                          # loads where they are used: a CPU gains nothing from loads in flight and
                          # spills the held tiles (heads 9/3 x 64, one query, depth 100 / 600:
                          # 2.2-2.6 / 8.3-8.9 ms, with the next tile's loads first 3.1-3.5 / 10.6-14.3)
                          fa_loads_first=0,
                          # GEMM: a CPU's threads are filled without splitting K
                          mm_split_fill_per_cu=0,
                          transpose_rows=2,
                          # mat-vec: a CPU's few threads need no more workgroups
                          mv_fill_groups=1,
                          # ... and fewer, longer invocations: a dense mat-vec takes one subgroup (8 lanes)
                          # a row while its rows keep 1024 invocations. SmolLM2 tg32 (vkrt bench, two
                          # runs): 4.9-5.3 -> 9.2 t/s (at 4096 invocations 7.1-8.0; mv_wg=8 for every
                          # mat-vec 9.4-10.0). bench/matmul.py Q4_1, 64 -> 8 lanes: 576x1536 1271 -> 788 us,
                          # 1536x576 678 -> 855 (alone; the model's whole step gains)
                          mv_lanes_threads=1024,
                          # grids filled from the grid buffer: IQ tests (test_iq_model, mul_mat_id) 9.4 -> 7.3 s
                          quant_tables_shared=True, quant_tables_buffer=True,
                          # short convolution, C = 8192: T = 2048 146 ms at 32 tokens, 176 at 16;
                          # T = 512 39 ms at 32, 47 at 16, 45 at 64
                          ssm_conv_chunk=32,
                          # delta rule: the recurrent form won at every length (T = 256, D = 32:
                          # 23 ms vs 93 ms chunked), so it always runs; chunked kernels compile
                          # rolled (LLVM took up to 10 s unrolled) with small state blocks, and
                          # 4 lanes a row at D = 128 (T = 256: 131 ms; 1 lane 145 ms and 3.7 s to compile)
                          gdn_lane_vec4s=8, gdn_unroll=False, gdn_scan_state=8, gdn_chunk_min_tokens=1 << 30),
    Arch.OTHER: Tuning(Arch.OTHER, subgroup=32, wg_size=128, reduce_wg=128),
}


def fa_mask_opt_rule(tuning: Tuning, *, has_mask: bool, nem0: int, nem1: int, hsk: int, hsv: int,
                     bc: int) -> bool:
    """Whether flash attention classifies the mask's Br x Bc blocks in a pre-pass (mask_opt).

    The pre-pass must pay for itself: a mask of at least 32 rows and more than 32768 elements,
    at least 16 KV tiles (one packed word) per tile row (nem0 >= 16*Bc). Every architecture and
    head size: the flag is read at run time by the same pipeline (no registers change), it only
    removes the mask reads of fully masked blocks and the mask add of fully visible ones, and the
    layers of a ubatch share one pre-pass. Upstream llama.cpp keeps it off on GCN below head 257,
    and the fork turned it on from 256 (RX 580: +8% at 16k, +12% at 32k context); at head 128
    under the GCN table on the H200 it won +25% at pp2048 and +18% at depth 4096
    (bench/flash_attn.py). VKRT_FA_MASK_OPT=0/1 overrides this rule (vkrt/ops/flash_attn.py).
    """
    return has_mask and nem1 >= 32 and nem0 * nem1 > 32768 and nem0 >= 16 * bc

