"""Flash attention (docs/ARCHITECTURE.md §4): scalar fp32 kernel, mask_opt pre-pass, split-K
merged by the last split; for prompt batches on devices with cooperative matrices, a kernel on
fp16 fragments with fp32 sums (shaders/flash_attn_cm.comp).

    out = softmax(S) V,  S = softcap * tanh(scale * Q K^T / softcap) + slope_h * mask
    (with attention sinks, one value s_h a query head: out = exp(S) V / (sum exp(S) + exp(s_h)))

(without softcap S = scale * Q K^T + slope_h * mask; slope_h = 1 without ALiBi, else ALiBi's
slope for head h from max_bias, as ggml). Shapes and layouts: vkrt/ops/attn_shapes.py. Rows
whose keys are all masked come out as zeros. K and V rows must be finite where masked, as in
llama.cpp (0 * inf is NaN). K and V may be quantised KV caches (ops/kv_quant.py: Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, IQ4_NL), which both kernels dequantise as they load them (gguf's values; the
cooperative-matrix kernel then holds them as fp16, as it does an F32 cache's).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..device.tuning import Tuning, fa_mask_opt_rule
from ..errors import ConfigError, UnsupportedShape
from ..memory import F16, I32, Tensor
from ..pipeline import PushConstants, kernel
from .attn_shapes import attn_shape, element_strides
from .binding import bind_tensor, f32_binding
from .fa_norm_rope import FA_NORM_ROPE_PUSH, FANormRope
from .flash_work import FlashWork
from .grid import ceil_div
from .hadamard import hadamard, rotation_defines
from .kv_quant import KV_QUANT, check_rows, is_quantised, kv_type

KV_TYPES = tuple(kv_type(n) for n in ("F16", "F32", *KV_QUANT))   # what the scalar kernel reads

MASK_OPT_WG = 64  # blocks per workgroup of fa_mask_opt.comp (its local_size_x)

_U32 = ("N", "KV", "n_head", "gqa", "q_off", "q_nb1", "q_nb2", "q_nb3", "k_off", "k_nb1", "k_nb2", "k_nb3",
        "v_off", "v_nb1", "v_nb2", "v_nb3", "m_off", "m_nb1", "m_nb2", "m_nb3", "nem2", "nem3", "o_off", "flags",
        "n_split")
FA_PUSH = PushConstants(*((n, "u32") for n in _U32), ("scale", "f32"), ("softcap", "f32"), ("max_bias", "f32"),
                        ("s_off", "u32"))
MASK_OPT_PUSH = PushConstants(*((n, "u32") for n in ("N", "KV", "m_off", "m_nb1", "m_nb2", "m_nb3", "nem2")))


@dataclass(frozen=True)
class FATile:
    """One flash-attention workgroup: `br` query rows x `bc` KV columns per tile, threads laid out
    as row_groups x cols (column lanes) x d_split (lanes sharing a dot product)."""

    br: int
    bc: int
    d_split: int
    cols: int
    row_groups: int

    @property
    def wg(self) -> int:
        return self.row_groups * self.cols * self.d_split

    def shared_bytes(self, hsk: int, hsv: int) -> int:
        return 4 * self.br * max(hsk, hsv) + 8 * self.br * self.cols

    def kv_shared_bytes(self, hsk: int, hsv: int) -> int:
        """The K/V tile that LOADS_FIRST 3 adds: bc rows of each as floats, padded by one vec4."""
        return self.bc * 16 * (hsk // 4 + 1 + hsv // 4 + 1)

    def held_bytes(self, hsk: int, hsv: int, k_type, v_type) -> float:
        """A thread's share of a tile's K and V as stored (LOADS_FIRST 1, 2 hold it in registers):
        bc / cols cells, 1 / d_split of each row."""
        row = hsk * k_type.type_size / k_type.block_size + hsv * v_type.type_size / v_type.block_size
        return self.bc // self.cols * row / self.d_split


def fa_tile(tuning: Tuning, hsk: int, hsv: int, n_q: int, shared_memory: int, pack: int = 1,
            max_rows: int | None = None, bc: int | None = None, o_regs: int | None = None,
            cols: int | None = None, d_split: int | None = None, wg: int | None = None) -> FATile | None:
    """The tile for these head sizes: d_split divides both head sizes in vec4s; rows per thread
    from the accumulator budget (tuning.fa_o_regs), no more than the query rows need or the
    shared memory (the Q tile) allows (and at most `max_rows`, default tuning.fa_max_rows). With
    `pack` heads packed into the rows, Br and pack must divide one another (None when no row
    count does). `bc`: KV columns a tile (default tuning.fa_bc); `o_regs`: the accumulator budget
    (default tuning.fa_o_regs); `cols`: column lanes (default tuning.fa_cols); `d_split`: lanes a
    dot product (default tuning.fa_d_split); `wg`: invocations (default tuning.fa_wg)."""
    bc, cols = bc or tuning.fa_bc, cols or tuning.fa_cols
    if bc % cols:
        raise ConfigError(f"tuning for {tuning.arch.value}: {bc} KV columns a tile is not a multiple of {cols} "
                          "column lanes (fa_cols, fa_decode_cols)")
    lsb = (hsk | hsv) & -(hsk | hsv)
    ds = max(1, min(d_split or tuning.fa_d_split, lsb // 4))
    rg = max(1, (wg or tuning.fa_wg) // (ds * cols))
    rpt = max(1, min(max_rows or tuning.fa_max_rows, (o_regs or tuning.fa_o_regs) // (hsv // ds), ceil_div(n_q, rg)))
    tile = FATile(rg * rpt, bc, ds, cols, rg)
    while rpt > 1 and (tile.shared_bytes(hsk, hsv) > shared_memory or (tile.br % pack and pack % tile.br)):
        rpt -= 1
        tile = FATile(rg * rpt, bc, ds, cols, rg)
    return None if tile.br % pack and pack % tile.br else tile


def fa_cm_shared_bytes(hsk: int, hsv: int, bc: int, subgroups: int) -> int:
    """Shared memory of shaders/flash_attn_cm.comp (its layout: Q, or K, V and each subgroup's
    S, P and rescale factors)."""
    kv_s_p_a = bc * (hsk + 8) // 4 + bc * (hsv + 8) // 4 + subgroups * (8 * (bc + 4) + 4 * (bc + 8) + 128)
    return 8 * max(kv_s_p_a, 4 * subgroups * (hsk + 8))


def fa_cm_tile(hsk: int, hsv: int, shared_memory: int, subgroup: int) -> FATile | None:
    """The cooperative-matrix kernel's tile: a subgroup per 16 query rows, 4 (else 2) of them,
    KV tiles of 64, 32 or 16 cells, the largest that fits the shared memory (None where none
    does). Its `cols` are a subgroup's lanes (the workgroup is subgroups x lanes)."""
    for bc in (64, 32, 16):
        for subgroups in (4, 2):
            if fa_cm_shared_bytes(hsk, hsv, bc, subgroups) <= shared_memory:
                return FATile(16 * subgroups, bc, 1, subgroup, subgroups)
    return None


def fa_cm_defines(hsk: int, hsv: int, tile: FATile, **options) -> dict:
    """The cooperative-matrix kernel's defines for this tile (from fa_cm_tile) and options
    (K_F16, V_F16, HAS_MASK, KV_USED, SINKS)."""
    return dict(HSK=hsk, HSV=hsv, BC=tile.bc, NSG=tile.row_groups, SGS=tile.cols, **options)


def split_plan(tuning: Tuning, groups: int, kv_tiles: int, split_k: int | None, max_splits: int,
               decode: bool = False) -> tuple[int, int]:
    """(splits, KV tiles per split) for a grid of `groups` workgroups over `kv_tiles` KV tiles.
    split_k None: split while the grid is below tuning.fa_fill_groups, each split keeping at
    least fa_split_min_tiles tiles (fa_decode_split_min_tiles for `decode`-sized calls); an int
    forces that many (1 = none). No split is left without tiles."""
    if split_k is None:
        n = 1
        if groups < tuning.fa_fill_groups:
            least = tuning.fa_decode_split_min_tiles if decode else tuning.fa_split_min_tiles
            n = min(ceil_div(tuning.fa_fill_groups, groups), kv_tiles // least)
    elif int(split_k) < 1:
        raise UnsupportedShape(f"split_k must be at least 1 (no split), got {split_k}")
    else:
        n = int(split_k)
    n = max(1, min(n, kv_tiles, max_splits))
    per = ceil_div(kv_tiles, n)
    return ceil_div(kv_tiles, per), per


def mask_opt_rows(tile: FATile, pack: int) -> int:
    """Token rows of one mask_opt block: Br, or with `pack` heads packed, a workgroup's tokens."""
    return tile.br if pack == 1 else max(1, tile.br // pack)


def mask_opt_kernel(device, rows: int, bc: int):
    """The mask_opt pre-pass pipeline for blocks of `rows` x `bc`."""
    return kernel(device, "fa_mask_opt", push=MASK_OPT_PUSH, defines=dict(BR=rows, BC=bc))


def _vec4_offset(t: Tensor, byte_off: int, what: str) -> int:
    """Element offset of t's first element in its binding; it and t's strides must be multiples
    of 4 elements (the kernel reads K and V 4 elements at a time). A quantised cache's offset
    counts the elements of the whole blocks before it."""
    if is_quantised(t):
        check_rows(t, f"flash attention {what}")
        if byte_off % t.type.type_size:
            raise UnsupportedShape(f"flash attention reads {what} by blocks: its offset ({byte_off} bytes into the "
                                   f"binding) must be whole {t.type.name} blocks")
        return byte_off // t.type.type_size * t.type.block_size
    off = byte_off // t.type.type_size
    if off % 4 or any(s % 4 for s in element_strides(t)):
        raise UnsupportedShape(f"flash attention reads {what} 4 elements at a time: its offset ({off} elements into "
                               f"the binding) and strides {t.nb} must be multiples of {4 * t.type.type_size} bytes")
    return off


class FlashAttn:
    """Flash attention over fixed tensors: picks the tile, mask_opt and split-K once and takes
    the memory they need (the mask_opt block table, split-K's partials and done counts) from
    `work`, a FlashWork the caller owns (the engine's Scratch has one); it owns nothing itself.
    record(seq) adds the pre-pass and attention dispatches (the last split merges the others).

    mask_opt: None = the tuning rule; True/False force it (a model passes settings.fa_mask_opt) (ignored without
    a mask). split_k: None = split when the grid is too small to fill the device; n forces n
    splits (1 = none). gqa_pack: pack the query heads of a KV head into one workgroup's rows (K
    and V read once per KV head); None = when there are at most tuning.fa_pack_max_q queries and
    the shape allows it (grouped heads, one mask plane, no ALiBi). prologue: an FANormRope (one
    token): the attention does norm_rope's work in its prologue, reading the projection's queries
    in place of q and storing the new cell's K and V; `self.prologue` is None where this call
    cannot take it (prologue_blocker says why), and the caller then runs norm_rope itself.
    kv_used: a 1-element I32 tensor holding how many leading KV cells are live (written each
    step; the cells past it must be masked): later KV tiles are skipped, with the same result,
    and the splits share the live tiles. sinks: F32, one attention sink a query head (gpt-oss), or None. tuning: another
    architecture's table entry (tests). K and V offsets and strides must be multiples of 4
    elements (the kernel reads 4 at a time). work: needed to record where mask_opt classifies
    the mask (not shared) or the KV tiles are split; the decisions need none. out_rot: the output
    rotated back in runs of out_rot as hadamard() would after it (a cache whose V is stored
    rotated), inside the scalar kernel (the cooperative-matrix one records hadamard() after it).
    mask_zero: a 1-element I32 tensor written each step, nonzero where the mask is 0 on every
    cell below kv_used in every row (one sequence's decode): a decode-sized call of the scalar
    kernel (head sizes up to tuning.fa_mask_zero_max_head) then reads no mask, with the same
    result; other calls read the mask as always.
    """

    def __init__(self, device, q: Tensor, k: Tensor, v: Tensor, out: Tensor, mask: Tensor | None = None, *,
                 scale: float, softcap: float = 0.0, max_bias: float = 0.0, mask_opt: bool | None = None,
                 split_k: int | None = None, gqa_pack: bool | None = None, kv_used: Tensor | None = None,
                 tuning: Tuning | None = None, label: str = "flash_attn", share_mask_opt: "FlashAttn | None" = None,
                 sinks: Tensor | None = None, work: FlashWork | None = None, coopmat: bool | None = None,
                 prologue: FANormRope | None = None, out_rot: int = 0, mask_zero: Tensor | None = None):
        self.label = label
        self.device = device
        self.shape = s = attn_shape(q, k, v, out, mask, kv_types=KV_TYPES)
        self.out_rot = out_rot
        if out_rot and (out_rot & (out_rot - 1) or not 2 <= out_rot <= min(s.hsv, 1024) or s.hsv % out_rot):
            raise UnsupportedShape(f"{label}: the output rotated back in runs of {out_rot}; needs a power of two "
                                   f"from 2 that divides the head ({s.hsv})")
        self.tuning = tuning or device.tuning
        for name, t in (("kv_used", kv_used), ("mask_zero", mask_zero)):
            if t is not None and (t.type != I32 or t.nelements != 1):
                raise UnsupportedShape(f"{name} must be one I32 element, got {t!r}")
        self.quantised = is_quantised(k) or is_quantised(v)
        self._kv_types = (k.type, v.type)
        decide = (max_bias, gqa_pack, coopmat, split_k, mask, mask_opt)
        self._decide(*decide, prologue=prologue is not None)
        usable = prologue is not None and self.prologue_blocker(prologue, k, v, max_bias) is None
        if prologue is not None and not usable and self.prologue_rows:
            self._decide(*decide, prologue=False)   # the rows a call without the prologue gets
        self.prologue = prologue if usable else None
        self._mask = None
        # another FlashAttn over the same mask and tile (an earlier layer) whose pre-pass result
        # this one reads instead of classifying the mask again
        self._shared = share_mask_opt if self._can_share(share_mask_opt, mask) else None
        # uint32 words, 2 bits per Br x Bc mask block: [nem3 * nem2][row tile][ceil(KV tiles / 16)]
        self.mask_opt_blocks = None
        self.work = work
        # the mask skipped in steps that flag it all zero (the live cells bound what it covers)
        limit = self.tuning.fa_mask_zero_max_head
        head_ok = self.tuning.fa_mask_zero and (limit == 0 or max(self.shape.hsk, self.shape.hsv) <= limit)
        self._mask_zero_t = (mask_zero if mask is not None and kv_used is not None and self.decode_sized
                             and not self.coopmat and head_ok else None)
        self._build(q, k, v, out, mask, scale, softcap, max_bias, kv_used, sinks)

    # -- decisions ---------------------------------------------------------------------------
    def _decide(self, max_bias, gqa_pack, coopmat, split_k, mask, mask_opt, prologue: bool) -> None:
        """The packing, tile, kernel, mask_opt and split of this call (`prologue`: as one taking
        norm_rope's work)."""
        s = self.shape
        self.prologue_rows = self._prologue_rows() if prologue else None
        self.pack, self.tile = self.decide_pack(max_bias, gqa_pack)
        cm_tile = self.decide_coopmat(coopmat, split_k)
        self.coopmat = cm_tile is not None
        if self.coopmat:
            self.tile = cm_tile
        self.n_row_tiles = ceil_div(s.n_q * self.pack, self.tile.br)
        self.n_kv_tiles = ceil_div(s.n_kv, self.tile.bc)
        self.mask_opt = self.decide_mask_opt(mask, mask_opt)
        self.n_split = self.decide_split(split_k)[0]

    def _prologue_rows(self) -> int | None:
        """Rows a thread for an F16/F32 cache's one-token call with the prologue at this head size
        (tuning.fa_prologue_pack_rows_by_head), None where the table names none."""
        s = self.shape
        if self.quantised or s.n_q != 1 or s.batch != 1:
            return None
        return self._by_head(self.tuning.fa_prologue_pack_rows_by_head)

    def _by_head(self, pairs: tuple, default: int | None = None) -> int | None:
        """The count (head size, count) `pairs` name for this call's head size (K's and V's
        alike), else `default`."""
        s = self.shape
        return dict(pairs).get(s.hsv, default) if s.hsk == s.hsv else default

    def _can_share(self, other: "FlashAttn | None", mask) -> bool:
        return (other is not None and mask is not None and self.mask_opt and other.mask_opt
                and other.tile.bc == self.tile.bc and other.mask_rows == self.mask_rows
                and other.shape.n_q == self.shape.n_q and other.shape.n_kv == self.shape.n_kv
                and other._mask_tensor is mask)

    @property
    def decode_sized(self) -> bool:
        """At most tuning.fa_pack_max_q queries (a decode step of that many sequences): packed
        where the shape allows, tiles of fa_decode_bc cells over fa_decode_cols column lanes, split
        down to fa_decode_split_min_tiles."""
        return self.shape.n_q <= self.tuning.fa_pack_max_q

    def decide_pack(self, max_bias: float, forced: bool | None = None) -> tuple[int, FATile]:
        """(query heads packed a workgroup: 1 or gqa, the tile); `forced` as gqa_pack."""
        s, tuning, shared = self.shape, self.tuning, self.device.profile.shared_memory
        why = ("there is one query head per KV head" if s.gqa == 1 else
               "the mask has a plane per head" if s.nem2 > 1 else
               "ALiBi slopes differ per head" if max_bias > 0 else None)
        bc = tuning.fa_decode_bc if self.decode_sized else None
        cols = min(tuning.fa_decode_cols, bc or tuning.fa_bc) if self.decode_sized and tuning.fa_decode_cols else None
        ds = self._by_head(tuning.fa_quant_decode_d_split_by_head) if self.decode_sized and self.quantised else None
        rows = self.prologue_rows or self._pack_rows()
        packed = (fa_tile(tuning, s.hsk, s.hsv, s.n_q * s.gqa, shared, pack=s.gqa, max_rows=rows, bc=bc,
                          o_regs=tuning.fa_pack_o_regs, cols=cols, d_split=ds)
                  if why is None else None)
        if why is None and packed is None:
            why = f"no tile of this device holds a multiple or a divisor of {s.gqa} rows"
        if forced and why:
            raise UnsupportedShape(f"{self.label}: cannot pack the query heads of a KV head: {why}")
        if forced is None:
            forced = why is None and self.decode_sized
        if forced:
            return s.gqa, packed
        wg = None if self.decode_sized or self.quantised else self._by_head(tuning.fa_prompt_wg_by_head)
        wg = wg and min(wg, self.device.profile.max_workgroup_invocations)
        return 1, fa_tile(tuning, s.hsk, s.hsv, s.n_q, shared, bc=bc, cols=cols, d_split=ds, wg=wg)

    def decide_coopmat(self, forced: bool | None, split_k: int | None) -> FATile | None:
        """The cooperative-matrix kernel's tile where it runs this attention, else None; `forced`
        as coopmat."""
        s, tuning, p = self.shape, self.tuning, self.device.profile
        tile = fa_cm_tile(s.hsk, s.hsv, p.shared_memory, p.subgroup_size)
        why = ("the tuning runs no flash attention on cooperative matrices" if not tuning.fa_coopmat else
               "the query heads of a KV head are packed" if self.pack > 1 else
               f"head sizes {s.hsk}/{s.hsv} are not multiples of 16" if s.hsk % 16 or s.hsv % 16 else
               f"it does not split along KV (split_k={split_k})" if split_k not in (None, 1) else
               "no tile fits the shared memory" if tile is None else None)
        if forced and why:
            raise UnsupportedShape(f"{self.label}: no flash attention on cooperative matrices: {why}")
        head_ok = not tuning.fa_cm_max_head or max(s.hsk, s.hsv) <= tuning.fa_cm_max_head
        runs = why is None and s.n_q >= tuning.fa_cm_min_q and head_ok if forced is None else bool(forced)
        return tile if runs else None

    @property
    def n_tiles(self) -> int:
        """Workgroups of one split: row tiles x (query heads / packed heads) x batch."""
        return self.n_row_tiles * self.shape.n_head // self.pack * self.shape.batch

    @property
    def mask_rows(self) -> int:
        """Token rows of one mask_opt block."""
        return mask_opt_rows(self.tile, self.pack)

    def decide_mask_opt(self, mask, forced=None) -> bool:
        """mask_opt for this mask: `forced`, else the tuning rule."""
        if mask is None:
            return False
        if forced is not None:
            return bool(forced)
        s = self.shape
        return fa_mask_opt_rule(self.tuning, has_mask=True, nem0=mask.ne[0], nem1=mask.ne[1], hsk=s.hsk, hsv=s.hsv,
                                bc=self.tile.bc)

    def decide_split(self, split_k=None) -> tuple[int, int]:
        """(splits, KV tiles per split) for this grid; split_k as in split_plan."""
        s = self.shape
        if self.coopmat:
            return 1, self.n_kv_tiles
        return split_plan(self.tuning, self.n_tiles, self.n_kv_tiles, split_k,
                          self.device.profile.max_workgroup_count[2] // s.batch, self.decode_sized)

    def prologue_blocker(self, pro: FANormRope, k: Tensor, v: Tensor, max_bias: float) -> str | None:
        """Why this attention cannot do norm_rope's work in its prologue (None: it can): one token
        of one sequence, a head within tuning.fa_prologue_max_head, the scalar kernel, one workgroup
        a KV head and split, the prologue's caches those read here, room for its shared memory,
        whole norm subgroups a workgroup."""
        s, tile = self.shape, self.tile
        wg, sg = pro.defines.get("NR_WG", 0), pro.defines.get("NR_SG", 1)
        extra = self.prologue_shared_bytes(pro)
        same_cache = all(c.buffer is t.buffer and c.offset == t.offset and c.nb[1:3] == t.nb[1:3]
                         for c, t in ((pro.k_cache, k), (pro.v_cache, v)))
        limit = self.tuning.fa_prologue_max_head
        return ("more than one query token" if s.n_q != 1 or s.batch != 1 else
                f"head {max(s.hsk, s.hsv)} is past the tuning's fa_prologue_max_head ({limit})"
                if limit and max(s.hsk, s.hsv) > limit else
                "the cooperative-matrix kernel runs it" if self.coopmat else
                "a KV head's query heads are not one workgroup's" if self.pack == 1 and s.gqa > 1 else
                "the mask has a plane per head, or ALiBi" if s.nem2 > 1 or max_bias > 0 else
                "its K is not the prologue's cache" if not same_cache else
                "the queries' shape differs" if tuple(pro.q.ne[:3]) != (s.hsk, s.n_head, 1) else
                "the norm's subgroups do not tile the workgroup" if wg and tile.wg % sg else
                "no shared memory left for it"
                if tile.shared_bytes(s.hsk, s.hsv) + extra > self.device.profile.shared_memory else None)

    def prologue_shared_bytes(self, pro) -> int:
        """Shared memory the q/k norm and RoPE prologue `pro` (FANormRope) adds to the kernel's: with
        a quantised K or V, the words of its new row too (fa_norm_rope.glsl's copy for the tiles
        held as the words loaded; counted whatever the tile's loads)."""
        s = self.shape
        wg, sg = pro.defines.get("NR_WG", 0), pro.defines.get("NR_SG", 1)
        words = sum(hs // 32 * 9 + 1 for hs, t in zip((s.hsk, s.hsv), self._kv_types) if t.quantized)
        return 4 * (s.hsk + s.hsv + words) + (4 * (self.tile.br + 1) * (wg // sg) if wg else 0)

    def _pack_rows(self) -> int:
        """Rows a thread of a packed call: tuning.fa_pack_rows_by_type's for K's type (else V's),
        else (a quantised cache) fa_quant_decode_rows_by_head's, else fa_pack_rows_by_head's for
        the head size, else fa_pack_rows."""
        tuning = self.tuning
        if any(t.name in dict(tuning.fa_pack_rows_by_type) for t in self._kv_types):
            return self._by_type("fa_pack_rows")
        quant = self._by_head(tuning.fa_quant_decode_rows_by_head) if self.quantised else None
        return quant or self._by_head(tuning.fa_pack_rows_by_head, tuning.fa_pack_rows)

    def _by_type(self, field: str, kv_types: tuple | None = None) -> int:
        """The tuning's `field`, or its `field`_by_type count for K's type, else V's, where it names one."""
        by_type = dict(getattr(self.tuning, f"{field}_by_type"))
        k_type, v_type = kv_types or self._kv_types
        return by_type.get(k_type.name, by_type.get(v_type.name, getattr(self.tuning, field)))

    def loads_first(self, k_type, v_type) -> int:
        """The kernel's LOADS_FIRST: tuning.fa_loads_first (fa_loads_first_by_type's for K's type,
        else V's, where it names one) for decode-sized calls (0 otherwise), 3 (the K/V tile in
        shared memory) taken down to 2 where the tile does not fit beside the rest of the
        kernel's shared memory, and 2 (a tile ahead) down to 1 where a thread's share of a tile
        is past tuning.fa_ahead_max_bytes."""
        s, tile = self.shape, self.tile
        first = self._by_type("fa_loads_first", (k_type, v_type)) if self.decode_sized else 0
        if first == 3:
            kv = tile.kv_shared_bytes(s.hsk, s.hsv)
            extra = self.prologue_shared_bytes(self.prologue) if self.prologue else 0
            if tile.shared_bytes(s.hsk, s.hsv) + extra + kv > self.device.profile.shared_memory:
                first = 2
        limit = self.tuning.fa_ahead_max_bytes
        if first == 2 and limit and tile.held_bytes(s.hsk, s.hsv, k_type, v_type) > limit:
            first = 1
        return first

    # -- pipelines and scratch -----------------------------------------------------------------
    def _build(self, q, k, v, out, mask, scale, softcap, max_bias, kv_used, sinks) -> None:
        dev, s, tile = self.device, self.shape, self.tile
        pro = self.prologue
        self._q, q_off = bind_tensor(pro.q if pro else q, f"{self.label} q", dev)
        self._k, k_off = bind_tensor(k, f"{self.label} k", dev)
        self._v, v_off = bind_tensor(v, f"{self.label} v", dev)
        self._out, o_off = bind_tensor(out, f"{self.label} out", dev)
        self._out_tensor = out
        push = dict(N=s.n_q, KV=s.n_kv, n_head=s.n_head, gqa=s.gqa,
                    q_off=q_off // 4, k_off=_vec4_offset(k, k_off, "k"), v_off=_vec4_offset(v, v_off, "v"),
                    nem2=s.nem2, nem3=s.nem3, o_off=o_off // 4, flags=int(self.mask_opt),
                    n_split=self.n_split,
                    scale=scale / softcap if softcap else scale, softcap=softcap, max_bias=max_bias)
        for name, t in (("q", q), ("k", k), ("v", v)):
            push[f"{name}_nb1"], push[f"{name}_nb2"], push[f"{name}_nb3"] = element_strides(t)
        if pro:   # the projection's queries [head_dim, n_head, 1]: heads nb[1] apart
            push["q_nb2"] = pro.q.nb[1] // 4
        push.update(m_off=0, m_nb1=0, m_nb2=0, m_nb3=0)
        self._mask_tensor = mask
        if mask is not None:
            self._mask, m_off = bind_tensor(mask, f"{self.label} mask", dev)
            push["m_off"] = m_off // 2
            push["m_nb1"], push["m_nb2"], push["m_nb3"] = element_strides(mask)
        options = dict(K_F16=int(k.type == F16), V_F16=int(v.type == F16), HAS_MASK=int(mask is not None),
                       KV_USED=int(kv_used is not None), SINKS=int(sinks is not None))
        self._mask_zero = None
        if self._mask_zero_t is not None:
            options["MASK_ZERO"] = 1
            self._mask_zero, zero_off = bind_tensor(self._mask_zero_t, f"{self.label} mask_zero", dev)
            if zero_off:
                raise UnsupportedShape(f"mask_zero {self._mask_zero_t!r} must start at a storage-buffer offset "
                                       "alignment")
        if self.quantised:
            options.update(K_Q=KV_QUANT.get(k.type.name, 0), V_Q=KV_QUANT.get(v.type.name, 0))
        if self.coopmat:   # its workgroup is fixed by its defines (subgroups x lanes)
            shader, workgroup, defines = "flash_attn_cm", None, fa_cm_defines(s.hsk, s.hsv, tile, **options)
        else:
            shader, workgroup = "flash_attn", (tile.wg,)
            defines = dict(HSK=s.hsk, HSV=s.hsv, BR=tile.br, BC=tile.bc, DS=tile.d_split, COLS=tile.cols,
                           RG=tile.row_groups, UNROLL=int(self.tuning.fa_unroll), GQA_PACK=self.pack,
                           LOADS_FIRST=self.loads_first(k.type, v.type), SCATTER=int(self.tuning.fa_dot_scatter),
                           SPLIT_MIN=self.tuning.fa_decode_split_min_live if self.decode_sized else 1, **options)
        self._sinks, push["s_off"] = None, 0
        if sinks is not None:
            if sinks.nelements != s.n_head or not sinks.is_contiguous():
                raise UnsupportedShape(f"{self.label}: sinks must be {s.n_head} contiguous F32 values (one a query "
                                       f"head), got {sinks!r}")
            self._sinks, push["s_off"], _ = f32_binding(sinks, f"{self.label} sinks")
        self._kv_used = None
        if kv_used is not None:
            self._kv_used, used_off = bind_tensor(kv_used, f"{self.label} kv_used", dev)
            if used_off:
                raise UnsupportedShape(f"kv_used {kv_used!r} must start at a storage-buffer offset alignment")
        mask_fields = {f: push[f] for f in ("m_off", "m_nb1", "m_nb2", "m_nb3")}   # the prologue's push drops some
        layout = FA_PUSH
        if pro:
            defines.update(pro.defines)
            layout = FA_NORM_ROPE_PUSH
            push = {f: v for f, v in {**push, **pro.push}.items() if f in dict(layout.fields)}
        if self.out_rot and not self.coopmat:   # the cooperative-matrix kernel's output is rotated apart
            defines.update(rotation_defines("OUT_ROT", self.out_rot, self.label))
        self._attn = kernel(dev, shader, push=layout, defines=defines, workgroup=workgroup)
        self._attn_push = layout.pack(push)

        if self.mask_opt and self._shared is None:
            self._mask_opt_key = ("mask_opt blocks", id(mask.buffer), mask.offset)   # one table a mask
            self._mask_opt_kernel = mask_opt_kernel(dev, self.mask_rows, tile.bc)
            self._mask_opt_push = MASK_OPT_PUSH.pack(N=s.n_q, KV=s.n_kv, nem2=s.nem2, **mask_fields)

    def _work(self, what: str) -> FlashWork:
        if self.work is None:
            raise UnsupportedShape(f"{self.label}: {what} needs buffers: pass a FlashWork (work=)")
        return self.work

    def _split_buffers(self) -> tuple:
        """Split-K's partial O, (M, L) pairs and done counts (the last split of a row tile merges
        the splits: shaders/flash_attn.comp), from `work` as it is when recording."""
        s = self.shape
        rows = s.batch * s.n_q * s.n_head
        work = self._work(f"split-K over {self.n_split} splits")
        self._part = work.range("split O", 4 * self.n_split * rows * s.hsv)
        self._ml = work.range("split M, L", 8 * self.n_split * rows)
        self._done = work.range("splits done", 4 * self.n_tiles, zeroed=True)
        return self._part, self._ml, self._done

    @property
    def _mask_row_tiles(self) -> int:
        return ceil_div(self.shape.n_q, self.mask_rows)

    # -- recording -------------------------------------------------------------------------------
    def record(self, seq) -> None:
        """Record the mask_opt pre-pass (when on and not shared) and the attention."""
        if self._shared is None:
            self.record_mask_opt(seq)
        self.record_attention(seq)

    def record_mask_opt(self, seq) -> None:
        """Classify the mask's blocks into `mask_opt_blocks`, a table of `work` (nothing when
        mask_opt is off; a sharing op reads the table of the op it shares)."""
        if self.mask_opt and self._shared is None:
            s = self.shape
            words = s.nem2 * s.nem3 * self._mask_row_tiles * ceil_div(self.n_kv_tiles, 16)
            self.mask_opt_blocks = self._work("mask_opt").range(self._mask_opt_key, 4 * words)
            groups = (ceil_div(self.n_kv_tiles, MASK_OPT_WG), self._mask_row_tiles, s.nem2 * s.nem3)
            seq.dispatch(self._mask_opt_kernel, [self._mask, self.mask_opt_blocks], push=self._mask_opt_push,
                         groups=groups, label=f"{self.label} mask_opt")

    def record_attention(self, seq) -> None:
        """Record the attention (reading the mask_opt blocks the pre-pass recorded, when on)."""
        s = self.shape
        buffers = [self._q, self._k, self._v, self._out]
        if not self.coopmat:
            buffers += self._split_buffers() if self.n_split > 1 else (self._out,) * 3   # unread unsplit
        if self.mask_opt:
            if self._shared is not None:
                self.mask_opt_blocks = self._shared.mask_opt_blocks
            if self.mask_opt_blocks is None:
                raise UnsupportedShape(f"{self.label}: record the mask_opt pre-pass (of the op it shares) first")
        if self._mask is not None:
            buffers += [self._mask, self.mask_opt_blocks if self.mask_opt else self._mask]  # unread when off
        if self._kv_used is not None:
            buffers.append(self._kv_used)
        if self._sinks is not None:
            buffers.append(self._sinks)
        if self._mask_zero is not None:
            buffers.append(self._mask_zero)
        if self.prologue is not None:
            buffers += self.prologue.buffers
        seq.dispatch(self._attn, buffers, push=self._attn_push,
                     groups=(self.n_row_tiles, s.n_head // self.pack, s.batch * self.n_split), label=self.label)
        if self.out_rot and self.coopmat:
            hadamard(seq, self._out_tensor, self.out_rot)

