"""Flash attention reading quantised K and V caches, dequantised as it loads: the scalar kernel
against the float64 reference over gguf's dequantised K and V (the kernel's values are gguf's, so
the fp32 tolerance holds), prompt, decode (packed GQA, split KV) and the GCN layouts; the
cooperative-matrix kernel within fp16 operands' error (on a GPU that has it)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attn_reference import causal_mask, make_qkv
from kv_quant_reference import QUANT_KV, dequantize_rows, quantize_rows
from test_flash_attn import TOL, check, tuning

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy, write_tensor
from vkrt.device.architecture import Arch
from vkrt.errors import UnsupportedShape
from vkrt.memory import F32, Tensor
from vkrt.ops.flash_attn import FlashAttn
from vkrt.ops.flash_work import FlashWork
from vkrt.ops.kv_quant import KV_QUANT


def cache(device, a: np.ndarray, type_name: str) -> tuple[Tensor, np.ndarray]:
    """a (batch, heads, cells, head) as a tensor of `type_name` and the values it holds."""
    if type_name in ("F16", "F32"):
        vals = a.astype(np.float16 if type_name == "F16" else np.float32)
        return tensor_from_numpy(device, vals), vals.astype(np.float32)
    raw = quantize_rows(a.astype(np.float32), type_name)
    t = Tensor.empty(device, type_name, tuple(reversed(a.shape)))
    write_tensor(t, raw)
    return t, dequantize_rows(raw, type_name).reshape(a.shape)


def flash_q(device, q, k, v, k_type, v_type, mask=None, **kw):
    """FlashAttn over K and V stored as k_type / v_type: (out, the values K and V hold, the op)."""
    tk, kv_ = cache(device, k, k_type)
    tv, vv = cache(device, v, v_type)
    tq = tensor_from_numpy(device, q)
    tm = tensor_from_numpy(device, mask) if mask is not None else None
    out = Tensor.empty(device, F32, (v.shape[-1], q.shape[1], q.shape[2], q.shape[0]))
    try:
        with FlashWork(device) as work, CommandSequence(device) as seq:
            kw.setdefault("coopmat", False)
            fa = FlashAttn(device, tq, tk, tv, out, tm, scale=q.shape[-1] ** -0.5, work=work, **kw)
            with seq.record():
                fa.record(seq)
            seq.run()
            return read_tensor(out), kv_, vv, fa
    finally:
        for t in (tk, tv, tq, tm, out):
            if t is not None:
                t.close()


@pytest.mark.parametrize("kv", QUANT_KV)
@pytest.mark.parametrize("hs", [64, 128])
def test_prompt(device, kv, hs):
    rng = np.random.default_rng(hs + len(kv))
    q, k, v = make_qkv(rng, n_q=9, n_kv=40, hsk=hs, kv_dtype=np.float32)
    mask = causal_mask(9, 40)
    got, kd, vd, _ = flash_q(device, q, k, v, kv, kv, mask)
    check(got, q, kd, vd, mask)
    assert np.abs(kd - k).max() > 0   # the reference reads the quantised values, not the originals


def test_gcn_prompt_at_head_256_keeps_fa_wg(device):
    """The GCN table's 512-invocation prompt tile at head 256 is for f16 / f32 caches: ACO caps
    such a workgroup at 128 VGPRs, where iq4_nl's tile spills; a quantised cache keeps fa_wg."""
    rng = np.random.default_rng(7)
    q, k, v = make_qkv(rng, n_q=20, n_kv=40, hsk=256, kv_dtype=np.float32)
    mask = causal_mask(20, 40)
    t = tuning(device, Arch.AMD_GCN)
    got, kd, vd, fa = flash_q(device, q, k, v, "IQ4_NL", "IQ4_NL", mask, tuning=t)
    assert fa.tile.wg == t.fa_wg != dict(t.fa_prompt_wg_by_head)[256]
    check(got, q, kd, vd, mask)


@pytest.mark.parametrize("kv", ["Q8_0", "Q5_0", "Q4_1"])
def test_head_32(device, kv):
    """Rows of one block: 2-byte aligned blocks start inside a word every other row."""
    rng = np.random.default_rng(32)
    q, k, v = make_qkv(rng, n_q=3, n_kv=21, hsk=32, kv_dtype=np.float32)
    got, kd, vd, _ = flash_q(device, q, k, v, kv, kv)
    check(got, q, kd, vd)


@pytest.mark.parametrize("kv", QUANT_KV)
def test_decode_packed_split(device, kv):
    """One query, GQA packed, the KV split into several parts merged by the last."""
    rng = np.random.default_rng(3)
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=2, n_q=1, n_kv=200, hsk=64, kv_dtype=np.float32)
    mask = causal_mask(1, 200)
    got, kd, vd, fa = flash_q(device, q, k, v, kv, kv, mask, split_k=3)
    assert fa.pack == 2 and fa.n_split == 3
    check(got, q, kd, vd, mask)


@pytest.mark.parametrize("k_type,v_type", [("Q8_0", "F16"), ("F16", "Q4_0"), ("Q4_1", "IQ4_NL"), ("F32", "Q5_1")])
def test_mixed_types(device, k_type, v_type):
    rng = np.random.default_rng(5)
    q, k, v = make_qkv(rng, n_q=5, n_kv=48, hsk=128, kv_dtype=np.float32)
    got, kd, vd, _ = flash_q(device, q, k, v, k_type, v_type)
    check(got, q, kd, vd)


@pytest.mark.parametrize("kv,first", [("Q8_0", 2), ("Q5_0", 3), ("IQ4_NL", 0)])
def test_gcn_layouts(device, kv, first):
    """GCN's 256-invocation workgroups with its decode loads (LOADS_FIRST 2, 3: the tile in shared
    memory) and without."""
    import dataclasses
    rng = np.random.default_rng(11)
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=1, n_q=1, n_kv=130, hsk=128, kv_dtype=np.float32)
    t = dataclasses.replace(tuning(device, Arch.AMD_GCN), fa_loads_first=first, fa_loads_first_by_type=())
    got, kd, vd, fa = flash_q(device, q, k, v, kv, kv, tuning=t)
    assert fa._attn.defines["LOADS_FIRST"] == first
    check(got, q, kd, vd, tol=TOL)


@pytest.mark.parametrize("kv,vt,hs", [("Q8_0", "Q8_0", 128), ("Q4_0", "Q4_0", 256), ("IQ4_NL", "IQ4_NL", 64),
                                      ("Q5_1", "F16", 96), ("Q8_0", "Q4_1", 32)])
def test_gcn_quantised_tile_in_shared_memory(device, kv, vt, hs):
    """The GCN table dequantises a quantised K/V tile once a workgroup into shared memory
    (fa_loads_first_by_type 3; f16 keeps a tile ahead in registers): the bits of each value
    loaded where it is used (0), whose lanes take the same vec4s (a tile held as loaded words
    gives a lane consecutive vec4s instead: other sums). A thread's share is whole blocks, K's
    from the first thread up and V's from the last down: one to four blocks a row (head 32 to
    128), blocks starting at either half of a word, V f16 beside a quantised K."""
    import dataclasses
    rng = np.random.default_rng(hs)
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=2, n_q=1, n_kv=90, hsk=hs, kv_dtype=np.float32)
    t = tuning(device, Arch.AMD_GCN)
    got, kd, vd, fa = flash_q(device, q, k, v, kv, vt, tuning=t, split_k=2)
    if fa._attn.defines["LOADS_FIRST"] != 3:
        pytest.skip("the tile does not fit this device's shared memory")
    used, _, _, fb = flash_q(device, q, k, v, kv, vt, tuning=dataclasses.replace(t, fa_loads_first_by_type=(),
                                                                                  fa_loads_first=0), split_k=2)
    assert fb._attn.defines["LOADS_FIRST"] == 0
    np.testing.assert_array_equal(got.view(np.uint32), used.view(np.uint32))
    check(got, q, kd, vd, tol=TOL)


def _regs_tuning(device, arch, first=2):
    """`arch`'s tuning with fa_loads_first `first` at every tile size (no fa_ahead_max_bytes)."""
    import dataclasses
    return dataclasses.replace(tuning(device, arch), fa_loads_first=first, fa_ahead_max_bytes=0,
                               fa_loads_first_by_type=())


@pytest.mark.parametrize("kv", QUANT_KV)
@pytest.mark.parametrize("hs", [32, 64, 96, 128, 192, 256])
def test_decode_segments(device, kv, hs):
    """A decode tile held in registers (LOADS_FIRST 2, GCN's 8 dot lanes) keeps the blocks as loaded
    words: a lane's vec4s in segments of 1 (head 32, 96), 2 (64, 192), 4 (128) or 8 (256) chunks of
    a block, blocks starting at either half of a word (head 32: every other row)."""
    rng = np.random.default_rng(hs + 7 * len(kv))
    q, k, v = make_qkv(rng, n_head=4, n_head_kv=1, n_q=1, n_kv=70, hsk=hs, kv_dtype=np.float32)
    mask = np.zeros((1, 1, 1, 70), np.float16)
    mask[..., 61:] = -np.inf
    got, kd, vd, fa = flash_q(device, q, k, v, kv, kv, mask, tuning=_regs_tuning(device, Arch.AMD_GCN), split_k=2)
    assert fa._attn.defines["LOADS_FIRST"] == 2 and fa._attn.defines["DS"] == 8
    check(got, q, kd, vd, mask, tol=TOL)


@pytest.mark.parametrize("kv", ["Q8_0", "Q5_0", "Q4_1"])
@pytest.mark.parametrize("hs", [64, 96])
def test_decode_segments_one_lane(device, kv, hs):
    """One dot lane a column (lavapipe's layout) holds whole rows: several segments of 8 chunks."""
    rng = np.random.default_rng(hs)
    q, k, v = make_qkv(rng, n_head=2, n_head_kv=2, n_q=1, n_kv=37, hsk=hs, kv_dtype=np.float32)
    one_lane = dataclasses.replace(_regs_tuning(device, None), fa_d_split=1,
                                   fa_quant_decode_d_split_by_head=())
    got, kd, vd, fa = flash_q(device, q, k, v, kv, kv, tuning=one_lane)
    assert fa._attn.defines["LOADS_FIRST"] == 2 and fa._attn.defines["DS"] == 1
    check(got, q, kd, vd, tol=TOL)


@pytest.mark.parametrize("k_type,v_type,first", [("Q8_0", "Q5_1", 2), ("F16", "IQ4_NL", 2), ("Q5_0", "F32", 2),
                                                 ("Q4_0", "Q8_0", 1)])
def test_decode_segments_mixed(device, k_type, v_type, first):
    """K and V of different types, each held in its own segments (LOADS_FIRST 1: loaded at the
    tile's start, not a tile ahead)."""
    rng = np.random.default_rng(9)
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=2, n_q=2, n_kv=50, hsk=128, kv_dtype=np.float32)
    got, kd, vd, fa = flash_q(device, q, k, v, k_type, v_type, tuning=_regs_tuning(device, Arch.AMD_GCN, first))
    assert fa._attn.defines["LOADS_FIRST"] == first
    check(got, q, kd, vd, tol=TOL)


@pytest.mark.parametrize("kv,n_q,hs,takes", [("Q8_0", 1, 128, True), ("Q4_0", 2, 128, True), ("Q8_0", 1, 64, False),
                                              ("F16", 1, 128, False), ("Q8_0", 24, 128, False)])
def test_quant_decode_tile_by_head(device, kv, n_q, hs, takes):
    """tuning.fa_quant_decode_d_split_by_head / _rows_by_head: decode-sized calls over a quantised
    cache at a head size they name split a cell's dot product over their lanes (here 4 in the
    table's 8) with their rows a thread (a 64-invocation workgroup: 2 row groups of 4); other
    heads, F16 caches and prompt-sized calls keep the rest of the table. Each against the
    reference."""
    rng = np.random.default_rng(n_q + hs + len(kv))
    q, k, v = make_qkv(rng, n_head=16, n_head_kv=2, n_q=n_q, n_kv=150, hsk=hs, kv_dtype=np.float32)
    t = dataclasses.replace(tuning(device, Arch.AMD_GCN), fa_quant_decode_d_split_by_head=((128, 4),),
                            fa_quant_decode_rows_by_head=((128, 4),), fa_pack_rows_by_type=(), fa_pack_max_q=8,
                            fa_pack_o_regs=128, fa_wg=64)
    got, kd, vd, fa = flash_q(device, q, k, v, kv, kv, causal_mask(n_q, 150), tuning=t)
    assert fa.tile.d_split == (4 if takes else t.fa_d_split) and fa._attn.defines["DS"] == fa.tile.d_split
    assert not takes or fa.tile.br // fa.tile.row_groups == 4
    check(got, q, kd, vd, causal_mask(n_q, 150))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["Q8_0", "Q4_0"])
def test_quant_decode_tile_of_the_device_table(device, kv):
    """The device's own table at head 128 over a quantised cache (NVIDIA: 16 dot lanes, 4 rows a
    thread), decode of a KV head's 8 query heads, split along KV: against the reference."""
    rng = np.random.default_rng(16)
    q, k, v = make_qkv(rng, n_head=32, n_head_kv=4, n_q=1, n_kv=3000, hsk=128, kv_dtype=np.float32)
    got, kd, vd, fa = flash_q(device, q, k, v, kv, kv)
    t = device.tuning
    assert fa.tile.d_split == dict(t.fa_quant_decode_d_split_by_head).get(128, t.fa_d_split) and fa.n_split > 1
    check(got, q, kd, vd)


@pytest.mark.gpu
@pytest.mark.parametrize("k_type,v_type", [("Q8_0", "Q8_0"), ("Q4_0", "Q5_1"), ("IQ4_NL", "F16"), ("F16", "Q4_1")])
def test_quantised_on_cooperative_matrices(device, k_type, v_type):
    """Where the tuning runs prompt attention on cooperative matrices, a quantised cache runs
    there too (its blocks dequantised as the tile is copied, held as fp16): within fp16 operands'
    error of the reference over gguf's values, beside the scalar kernel on the same caches."""
    from test_flash_attn_cm import CM_TOL, needs_coopmat
    from attn_reference import attention_reference, nmse
    needs_coopmat(device)
    rng = np.random.default_rng(len(k_type + v_type))
    q, k, v = make_qkv(rng, n_head=8, n_head_kv=2, n_q=70, n_kv=150, hsk=128, kv_dtype=np.float32)
    mask = causal_mask(70, 150)
    got, kd, vd, fa = flash_q(device, q, k, v, k_type, v_type, mask, coopmat=None)
    plain, _, _, _ = flash_q(device, q, k, v, k_type, v_type, mask, coopmat=False)
    assert fa.coopmat
    assert (fa._attn.defines["K_Q"], fa._attn.defines["V_Q"]) == (KV_QUANT.get(k_type, 0), KV_QUANT.get(v_type, 0))
    ref = attention_reference(q, kd, vd, mask, scale=128 ** -0.5)
    assert np.isfinite(got).all() and nmse(plain, ref) < TOL
    assert 0 < nmse(got, ref) < CM_TOL


@pytest.mark.parametrize("k_q,v_q", [(1, 1), (2, 0), (0, 6), (5, 3)])
def test_cooperative_matrix_kernel_compiles_quantised(k_q, v_q):
    """The cooperative-matrix kernel over each side quantised or not compiles (lavapipe cannot
    run it) at the shared memory its tile takes."""
    from vkrt.ops.flash_attn import fa_cm_defines, fa_cm_shared_bytes, fa_cm_tile
    from vkrt.pipeline.compiler import compile_shader
    from vkrt.pipeline.spirv import reflect
    tile = fa_cm_tile(128, 128, 49152, 32)
    options = dict(K_F16=int(not k_q), V_F16=int(not v_q), K_Q=k_q, V_Q=v_q, HAS_MASK=1, KV_USED=0, SINKS=0)
    spirv = compile_shader("flash_attn_cm", fa_cm_defines(128, 128, tile, **options))
    assert reflect(spirv).shared_bytes == fa_cm_shared_bytes(128, 128, tile.bc, tile.row_groups)
