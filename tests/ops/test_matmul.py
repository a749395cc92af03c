"""matmul (mat-vec and tiled GEMM) against a float64 numpy product of the dequantised weights."""

import dataclasses

import numpy as np
import pytest
from quant_data import (ALL, IQ, TQ, fp32_tile, gemm_limit, nmse, random_blocks, reference, weight_tensor,
                        wide_tile_pair)

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.device import Arch
from vkrt.device.tuning import TABLE
from vkrt.errors import UnsupportedShape
from vkrt.memory import Tensor, ggml_type
from vkrt.ops.matmul import gemm_splits, gemm_tuning, matmul

# normalised error allowed per weight type: the weights are exact, so this is fp32 accumulation
# (K up to a few hundred here); types dotted as a * sum(q x) + b * sum(x) lose a little more
THRESHOLD = {name: 1e-11 for name in ("F32", "F16", "BF16")} | {name: 1e-10 for name in ALL[3:]}


def k_for(name: str) -> int:
    t = ggml_type(name)
    return 3 * t.block_size if t.block_size == 256 else 5 * t.block_size if t.quantized else 101


def run(device, w, x_np, m, *, x=None, y=None, **kw) -> np.ndarray:
    """y = W x through vkrt; x_np is (n, k)."""
    own = []
    if x is None:
        x = tensor_from_numpy(device, x_np)
        own.append(x)
    if y is None:
        y = Tensor.empty(device, "F32", (m, x_np.shape[0]))
        own.append(y)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                matmul(seq, w, x, y, **kw)
            seq.run()
        return read_tensor(y)
    finally:
        for t in own:
            t.close()


def check(device, name, m, k, ns, seed=0, **kw):
    rng = np.random.default_rng(seed)
    raw = random_blocks(name, m, k, rng, scale=0.5)
    wf = reference(name, raw).astype(np.float64)
    w = weight_tensor(device, name, raw, (k, m))
    try:
        for n in ns:
            x = rng.standard_normal((n, k)).astype(np.float32)
            got = run(device, w, x, m, **kw)
            err = nmse(got, x.astype(np.float64) @ wf.T)
            limit = gemm_limit(THRESHOLD[name], kw.get("tuning") or device.tuning)
            assert err < limit, f"{name} M={m} K={k} n={n}: normalised error {err:.3g}"
    finally:
        w.close()


@pytest.mark.parametrize("name", ALL)
def test_every_type(device, name):
    """67 rows (a multiple of neither the mat-vec rows nor the GEMM tile); the mat-vec (9 and 16
    columns: in runs of mv_max_n), the GEMM (64), and the GEMM for 9 and 16 columns too. The IQ
    quants, MXFP4 and the TQ types (whose kernels differ from the others' only in their includes)
    at 1, 9 and 64 columns: the mat-vec of one and of several columns and the GEMM."""
    if name in IQ + TQ:
        check(device, name, 67, k_for(name), (1, 9, 64))
        return
    check(device, name, 67, k_for(name), (1, 5, 9, 16, 64))
    check(device, name, 67, k_for(name), (9, 16), tuning=dataclasses.replace(device.tuning, mv_chunk_n=0))


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "F16"])
def test_token_counts(device, name):
    check(device, name, 35, 256, (*range(1, 10), 31, 512), seed=1)


@pytest.mark.parametrize("name,k", [("Q8_0", 96), ("Q4_0", 160), ("Q4_K", 768), ("F32", 101), ("BF16", 70)])
def test_k_not_a_multiple_of_the_tile(device, name, k):
    tuning = fp32_tile(device.tuning, mm_bm=32, mm_bn=32, mm_bk=64, mm_tm=4, mm_tn=4, mv_chunk_n=0)
    check(device, name, 33, k, (1, 40), tuning=tuning)


@pytest.fixture
def work(device):
    """The caller's buffers for a GEMM's split-K partial tiles (a Scratch holds one in the engine)."""
    from vkrt.ops.flash_work import FlashWork
    with FlashWork(device, label="test work") as w:
        yield w


def split_tuning(device, groups=64, **kw):
    """The GEMM (no mat-vec) with split-K wherever it applies: small tiles so a small K has steps."""
    return fp32_tile(device.tuning, mm_bm=32, mm_bn=32, mm_bk=16, mm_tm=4, mm_tn=4, mv_chunk_n=0,
                     mm_split_groups=groups, mm_split_min_steps=2, **kw)


@pytest.mark.parametrize("name,k", [("Q4_0", 160), ("Q4_K", 768), ("Q6_K", 512), ("IQ4_XS", 512), ("F32", 101),
                                    ("F16", 200)])
def test_split_k_gemm(device, work, name, k):
    """A short GEMM cut along K (split_sum adding the partial tiles, kept in the caller's work
    buffers): against the reference, K not a multiple of the splits' ranges, rows not of the
    tile, 1 to 96 tokens; replays the same; refused without work buffers."""
    from vkrt.errors import UnsupportedShape
    t = split_tuning(device)
    assert gemm_splits(t, 37, k, 32) > 1 and gemm_splits(t, 37, k, 96) > 1
    check(device, name, 37, k, (1, 7, 32, 45, 96), tuning=t, work=work)   # 1 to 3 token tiles of 32
    rng = np.random.default_rng(5)
    w = weight_tensor(device, name, random_blocks(name, 37, k, rng, scale=0.5), (k, 37))
    x = rng.standard_normal((20, k)).astype(np.float32)
    try:
        a, b = run(device, w, x, 37, tuning=t, work=work), run(device, w, x, 37, tuning=t, work=work)
        with pytest.raises(UnsupportedShape, match="cut along K .* needs work="):
            run(device, w, x, 37, tuning=t)
    finally:
        w.close()
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_split_k_rule(device):
    """Splits only up to mm_split_max_tiles token tiles and fewer tiles than mm_split_groups; at
    least mm_split_min_steps BK steps a range, at most mm_split_max ranges, none empty."""
    t = fp32_tile(device.tuning, mm_bm=64, mm_bn=64, mm_bk=16, mm_split_groups=264, mm_split_min_steps=16,
                  mm_split_max=8, mm_split_max_tiles=4)
    assert gemm_splits(t, 4096, 4096, 64) == 5          # 64 row tiles: 264 / 64 -> 5 ranges of 52 steps
    assert gemm_splits(t, 1024, 4096, 64) == 8          # 16 row tiles: capped at mm_split_max
    assert gemm_splits(t, 14336, 4096, 64) == 2         # 224 row tiles
    assert gemm_splits(t, 4096, 4096, 65) == 3          # two token tiles: 128 tiles -> 3 ranges
    assert gemm_splits(t, 4096, 4096, 128) == 3
    assert gemm_splits(t, 1024, 4096, 256) == 5         # 4 x 16 tiles
    assert gemm_splits(t, 1024, 4096, 257) == 1         # past mm_split_max_tiles
    assert gemm_splits(t, 14336, 4096, 128) == 1        # 448 tiles fill the device
    assert gemm_splits(t, 17000, 4096, 64) == 1         # the rows fill the device
    assert gemm_splits(t, 1024, 256, 64) == 1           # 16 steps: one range of at least 16
    assert gemm_splits(t, 1024, 512, 64) == 2
    for m, k in ((1024, 4096), (4096, 1040), (333, 3000)):
        s = gemm_splits(t, m, k, 64)
        steps = -(-k // 16)
        size = -(-steps // s)
        assert (s - 1) * size < steps, (m, k, s)         # the last range holds steps
    assert gemm_splits(dataclasses.replace(t, mm_split_groups=0), 64, 4096, 8) == 1


@pytest.mark.parametrize("n", [24, 70])
def test_split_k_slices_take_the_splits_of_the_whole(device, work, n):
    """A slice of a split product's tokens (kernel_columns), of one token tile or three, is cut
    into the same K ranges as the whole, though alone it would be cut otherwise."""
    t = split_tuning(device, groups=16)
    rng = np.random.default_rng(43)
    m, k = 40, 512
    assert gemm_splits(t, m, k, n) != gemm_splits(t, m, k, n - n // 2) or n <= t.mm_bn
    w = weight_tensor(device, "Q4_K", random_blocks("Q4_K", m, k, rng, scale=0.5), (k, m))
    x = rng.standard_normal((n, k)).astype(np.float32)
    try:
        whole = run(device, w, x, m, tuning=t, work=work)
        half = run(device, w, x[n // 2:], m, tuning=t, kernel_columns=n, work=work)
    finally:
        w.close()
    np.testing.assert_array_equal(half.view(np.uint32), whole[n // 2:].view(np.uint32))


@pytest.mark.parametrize("name", ["Q5_1", "F16"])
def test_split_k_in_row_ranges(device, work, name):
    """Weights bound in row ranges (a binding limit): each range split and summed apart."""
    k = 320
    row = ggml_type(name).row_bytes(k)
    check(device, name, 50, k, (3, 20), tuning=split_tuning(device), max_binding=7 * row + 64, work=work)


@pytest.mark.parametrize("name,k,lanes", [("Q4_0", 64, 8), ("Q8_0", 32, 4), ("Q6_K", 256, 8), ("Q2_K", 1024, 16),
                                         ("Q4_K", 2048, 64), ("F16", 40, 16)])
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_mat_vec_row_groups(device, name, k, lanes, rows):
    """Rows short enough for a few lanes share a workgroup in groups (lanes sum by subgroup
    shuffles, a shared-memory tree or subgroup adds, by how many there are); rows past M in
    the last group are computed and dropped."""
    from vkrt.ops.mat_vec import mat_vec_lanes
    assert mat_vec_lanes(ggml_type(name), k, 64) == lanes
    check(device, name, 37, k, (1, 2), tuning=dataclasses.replace(device.tuning, mv_wg=64, mv_rows=rows))


def test_wide_tile_where_the_columns_fill_it(device):
    """The wide GEMM tile (mm_big_*) is taken past one narrow token tile (mm_bn) of columns
    (kernel_columns for a slice; experts' average pairs from one tile on) and gives the narrow
    tile's sums bit for bit; never on cooperative matrices."""
    narrow, wide = wide_tile_pair(device.tuning, 64, mv_chunk_n=0, mm_split_groups=0)   # no split along K
    assert gemm_tuning(wide, 32) is wide and gemm_tuning(narrow, 4096) is narrow
    assert (gemm_tuning(wide, 33).mm_bm, gemm_tuning(wide, 33).mm_bn) == (64, 64)
    assert gemm_tuning(wide, 31.5, spread=True) is wide and gemm_tuning(wide, 32, spread=True).mm_bn == 64
    assert gemm_tuning(dataclasses.replace(wide, mm_coopmat=True), 4096).mm_bn == wide.mm_bn
    # the GCN table (measured on the H200): 64 x 64 for one 64-wide token tile, 128 x 128 past it
    gcn = TABLE[Arch.AMD_GCN]
    assert gemm_tuning(gcn, 64) is gcn and gemm_tuning(gcn, 63.9, spread=True) is gcn
    assert (gemm_tuning(gcn, 65).mm_bm, gemm_tuning(gcn, 65).mm_bn) == (128, 128) == (
        gemm_tuning(gcn, 64, spread=True).mm_bm, gemm_tuning(gcn, 64, spread=True).mm_bn)
    rng = np.random.default_rng(21)
    m, k = 70, 256
    w = weight_tensor(device, "Q4_K", random_blocks("Q4_K", m, k, rng, scale=0.5), (k, m))
    x = rng.standard_normal((100, k)).astype(np.float32)
    try:
        for n in (20, 100):
            a, b = run(device, w, x[:n], m, tuning=narrow), run(device, w, x[:n], m, tuning=wide)
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
        part = run(device, w, x[:20], m, tuning=wide, kernel_columns=100)   # a slice of a wide product
        np.testing.assert_array_equal(part.view(np.uint32), b[:20].view(np.uint32))
    finally:
        w.close()
    check(device, "Q4_0", m, 128, (64, 100), tuning=wide)


def test_mat_vec_workgroup_narrower_than_a_subgroup(device):
    """A mat-vec workgroup of fewer invocations than a subgroup, all one row's lanes, sums them
    by subgroup adds over the part of one subgroup it fills."""
    from vkrt.ops.mat_vec import mat_vec_reduce, mat_vec_variant
    prof = device.profile
    wg = prof.subgroup_min // 2
    if wg < 2 or not prof.subgroup_arithmetic or mat_vec_reduce(prof, wg, wg) != "subgroup":
        pytest.skip("needs subgroup adds and subgroups of 4 lanes or more")
    tune = dataclasses.replace(device.tuning, mv_wg=wg)
    k = 32 * wg   # Q4_0: 4 units a block, so k / 8 = 4 * wg units, 4 a lane
    assert "REDUCE_SUBGROUP" in mat_vec_variant(device, ggml_type("Q4_0"), 1, tune, k=k, m=9, xvec4=True)[0]
    check(device, "Q4_0", 9, k, (1, 2), tuning=tune)


def test_mat_vec_groups_of_whole_subgroups(device):
    """Rows whose lanes are whole subgroups of one fixed size, two groups a workgroup (NVIDIA's
    K-quant rows of 2048: 64 lanes, 128 invocations) sum by subgroup adds, not the shared-memory
    tree: one column and a run of 4 against numpy, each column of the run the one-column bits."""
    from vkrt.ops.mat_vec import mat_vec_variant
    prof = device.profile
    sg = prof.subgroup_min
    if sg != prof.subgroup_max or not prof.subgroup_arithmetic:
        pytest.skip("needs subgroup adds and one fixed subgroup size")
    tune = dataclasses.replace(device.tuning, mv_wg=4 * sg, mv_lanes_threads=0, mv_fill_groups=1, mv_dense_max_n=4,
                               mv_max_n=4)
    k = 64 * sg   # Q4_K: 8 units a block of 256, so 2 * sg units a row and as many lanes
    defines = mat_vec_variant(device, ggml_type("Q4_K"), 4, tune, k=k, m=37, xvec4=True)[0]
    assert (defines["TPR"], defines["WG"], defines.get("REDUCE_SUBGROUP")) == (2 * sg, 4 * sg, 1)
    check(device, "Q4_K", 37, k, (1, 4), tuning=tune)
    assert_run_is_one_columns_bits(device, tune, 41, k=k, n=4)


@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS", "MXFP4"])
def test_codebook_shared_is_bit_identical(device, name):
    """The 4-bit codebook read from a shared copy of its 16 floats (quant_codebook_shared) against
    picked out of its vector: the same values, so mat-vec (1 and 3 columns) and tiled GEMM (40)
    give the same bits; and the values are gguf's."""
    from vkrt.ops.quant import type_defines
    rng = np.random.default_rng(23)
    m, k = 21, k_for(name)
    raw = random_blocks(name, m, k, rng, scale=0.5)
    w = weight_tensor(device, name, raw, (k, m))
    x = rng.standard_normal((40, k)).astype(np.float32)
    tunings = [dataclasses.replace(device.tuning, quant_codebook_shared=on) for on in (False, True)]
    assert ["QCODEBOOK_SHARED" in type_defines(ggml_type(name), t) for t in tunings] == [False, True]
    try:
        outs = [[run(device, w, x[:n], m, tuning=t) for n in (1, 3, 40)] for t in tunings]
    finally:
        w.close()
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert nmse(outs[1][2], x.astype(np.float64) @ reference(name, raw).astype(np.float64).T) < gemm_limit(THRESHOLD[name], device.tuning)


def test_slices_take_the_kernel_of_the_whole(device):
    """kernel_columns: a slice of a product's columns (the logits' slices of 64 rows) takes the
    kernel the whole product would, so a column's sums do not depend on the slice it falls in:
    the 8-column tail of 72 columns and a 36-column half get the 72-column GEMM's bits."""
    rng = np.random.default_rng(41)
    m, k = 40, 256
    w = weight_tensor(device, "Q4_K", random_blocks("Q4_K", m, k, rng, scale=0.5), (k, m))
    x = rng.standard_normal((72, k)).astype(np.float32)
    try:
        whole = run(device, w, x, m)
        tail = run(device, w, x[64:], m, kernel_columns=72)
        half = run(device, w, x[36:], m, kernel_columns=72)
    finally:
        w.close()
    np.testing.assert_array_equal(tail.view(np.uint32), whole[64:].view(np.uint32))
    np.testing.assert_array_equal(half.view(np.uint32), whole[36:].view(np.uint32))


@pytest.mark.parametrize("name", ["IQ3_XXS", "IQ2_S", "IQ1_M"])
def test_tables_buffer_fill_is_bit_identical(device, name):
    """The IQ grids' shared copies filled from the device's grid buffer (quant_tables_buffer,
    set 1) against every invocation storing the whole table from the constant array: the same
    tables, the same bits. The smallest grid, and both 8 KiB ones (IQ1_M shares IQ1_S's)."""
    from vkrt.ops.quant import type_defines
    rng = np.random.default_rng(29)
    m, k = 21, k_for(name)
    w = weight_tensor(device, name, random_blocks(name, m, k, rng, scale=0.5), (k, m))
    x = rng.standard_normal((2, k)).astype(np.float32)
    tunings = [dataclasses.replace(device.tuning, quant_tables_shared=True, quant_tables_buffer=on)
               for on in (False, True)]
    assert ["QTABLES_BUFFER" in type_defines(ggml_type(name), t) for t in tunings] == [False, True]
    try:
        a, b = (run(device, w, x, m, tuning=t) for t in tunings)
    finally:
        w.close()
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    check(device, name, m, k, (1,), tuning=tunings[1])


# a type of each unit layout: plain (4 elements, a K tail), 4 units a block, 8 with a header,
# K-quant units of 4, 16 units reading grids, 17-byte blocks, base-3 digits
@pytest.mark.parametrize("name", ["F32", "F16", "Q4_0", "Q4_K", "Q3_K", "IQ2_XXS", "MXFP4", "TQ1_0"])
def test_unrolled_units_are_bit_identical(device, name):
    """The unit loop unrolled (mv_unroll 2 and 4) sums in the rolled loop's order: the same bits
    (the loop, mv_dots, is the same for every type; the types differ in the unit it calls).
    Lanes a row fewer than its units (mv_wg 8), so a lane walks several (32 units a row: whole
    unrolled steps, which is where the kernel unrolls)."""
    from vkrt.ops.mat_vec import MV_UNITS, mat_vec_variant
    rng = np.random.default_rng(10)
    t = ggml_type(name)
    m, k = 13, t.block_size * 32 // MV_UNITS.get(name, 1) if t.quantized else 128
    w = weight_tensor(device, name, random_blocks(name, m, k, rng, scale=0.5), (k, m))
    x = rng.standard_normal((2, k)).astype(np.float32)
    tunings = [dataclasses.replace(device.tuning, mv_wg=8, mv_unroll=u) for u in (1, 2, 4)]
    try:
        for u, tune in zip((2, 4), tunings[1:]):
            assert mat_vec_variant(device, t, 1, tune, k=k, m=m, xvec4=True)[0].get("MV_UNROLL") == u
        # a lane with one unit at most never runs an unrolled step: not compiled in (its registers)
        one = dataclasses.replace(device.tuning, mv_wg=32, mv_unroll=2)
        assert "MV_UNROLL" not in mat_vec_variant(device, t, 1, one, k=k, m=m, xvec4=True)[0]
        outs = [run(device, w, x[:n], m, tuning=tune) for tune in tunings for n in (1, 2)]
    finally:
        w.close()
    for a in range(2, 6):
        np.testing.assert_array_equal(outs[a % 2].view(np.uint32), outs[a].view(np.uint32))
    check(device, name, m, k, (1,), tuning=dataclasses.replace(device.tuning, mv_wg=8, mv_unroll=4))


def assert_run_is_one_columns_bits(device, tune, seed, name="Q4_K", m=37, k=512, n=3):
    """A mat-vec over n token columns (a Q4_K one of 3 unless told) gives each column's one-column bits."""
    rng = np.random.default_rng(seed)
    w = weight_tensor(device, name, random_blocks(name, m, k, rng, scale=0.5), (k, m))
    x = rng.standard_normal((n, k)).astype(np.float32)
    try:
        runs = run(device, w, x, m, tuning=tune)
        ones = np.stack([run(device, w, x[i:i + 1], m, tuning=tune)[0] for i in range(n)])
    finally:
        w.close()
    np.testing.assert_array_equal(runs.view(np.uint32), ones.view(np.uint32))


@pytest.mark.parametrize("name,cols", [("Q4_K", 8), ("Q4_0", 8), ("F16", 8), ("Q4_K", 3), ("IQ2_XXS", 4), ("Q6_K", 4)])
def test_column_runs_equal_single_columns(device, name, cols):
    """Past mv_max_n columns (at most mv_dense_max_n; up to mv_chunk_n) the mat-vec runs over
    runs of columns: each column's sums are the one-column kernel's, bit for bit."""
    tune = dataclasses.replace(device.tuning, mv_max_n=8, mv_chunk_n=64, mv_dense_max_n=cols)
    assert_run_is_one_columns_bits(device, tune, 12, name, 21, k_for(name), 19)


def test_rows_by_type(device):
    """A type listed in tuning.mv_rows_by_type takes its own rows a group (GCN: Q6_K at 2)."""
    from vkrt.ops.mat_vec import mat_vec_variant
    tune = dataclasses.replace(device.tuning, mv_rows=4, mv_rows_by_type=(("Q6_K", 2),), mv_fill_groups=1)
    assert mat_vec_variant(device, ggml_type("Q6_K"), 1, tune, k=256, m=37, xvec4=True)[0]["NR"] == 2
    assert mat_vec_variant(device, ggml_type("Q4_K"), 1, tune, k=256, m=37, xvec4=True)[0]["NR"] == 4
    check(device, "Q6_K", 37, 512, (1, 3), tuning=tune)


def test_rows_of_one_column_by_type(device):
    """mv_rows_one_column_by_type: a type's one-column mat-vec takes its own rows a group (GCN:
    Q4_K at 2, for 4 waves), a run of several columns keeps mv_rows_by_type's or mv_rows; the
    columns' results are the one-column bits either way."""
    from vkrt.ops.mat_vec import mat_vec_variant
    tune = dataclasses.replace(device.tuning, mv_rows=4, mv_rows_by_type=(("Q6_K", 2),),
                               mv_rows_one_column_by_type=(("Q4_K", 2), ("Q6_K", 1)), mv_rows_multi=0,
                               mv_fill_groups=1, mv_dense_max_n=4)
    nr = lambda t, n: mat_vec_variant(device, ggml_type(t), n, tune, k=512, m=37, xvec4=True)[0]["NR"]
    assert (nr("Q4_K", 1), nr("Q4_K", 3), nr("Q6_K", 1), nr("Q6_K", 3), nr("Q4_0", 1)) == (2, 4, 1, 2, 4)
    check(device, "Q4_K", 37, 512, (1, 3), tuning=tune)
    assert_run_is_one_columns_bits(device, tune, 32)


def test_rows_of_a_run_of_columns(device):
    """mv_rows_multi: a run of several token columns takes that many rows a group (one column
    keeps mv_rows); each row is summed alike, so the columns' results are the one-column bits."""
    from vkrt.ops.mat_vec import mat_vec_variant
    tune = dataclasses.replace(device.tuning, mv_rows=4, mv_rows_by_type=(), mv_fill_groups=1, mv_rows_multi=1)
    q = ggml_type("Q4_K")
    nr = lambda n: mat_vec_variant(device, q, n, tune, k=512, m=37, xvec4=True)[0]["NR"]
    assert (nr(1), nr(3)) == (4, 1)
    assert_run_is_one_columns_bits(device, tune, 31)


@pytest.mark.parametrize("name,k", [("Q4_0", 512), ("Q4_K", 1024)])
def test_fewer_lanes_for_many_rows(device, name, k):
    """mv_lanes_threads: a dense mat-vec whose rows would keep enough invocations busy at fewer
    lanes a row takes fewer (halved down to a subgroup, the workgroup with them), decided by the
    matrix alone: a run of 3 columns gives each column's one-column bits, and both the reference's
    sums; a matrix of few rows, mul_mat_id's entry and the rule off keep every lane."""
    from vkrt.ops.mat_vec import mat_vec_shape
    sg, typ, m = device.profile.subgroup_max, ggml_type(name), 70
    tune = dataclasses.replace(device.tuning, mv_wg=4 * sg, mv_rows=4, mv_rows_multi=0, mv_fill_groups=1,
                               mv_rows_by_type=(), mv_rows_one_column_by_type=(), mv_lanes_threads=18 * sg)
    shape = lambda t, n, rows=m, entry="mul_mv": mat_vec_shape(device, typ, n, t, k=k, m=rows, entry=entry)[:2]
    assert shape(tune, 1) == shape(tune, 3) == (sg, sg)   # 18 groups of 4 rows x sg lanes
    assert shape(tune, 1, rows=m - 4) == (2 * sg, 2 * sg)   # 17 groups: 2 subgroups' lanes a row
    assert shape(dataclasses.replace(tune, mv_lanes_threads=0), 1) == (4 * sg, 4 * sg)
    assert shape(tune, 1, entry="mul_mv_id")[1] == 4 * sg
    check(device, name, m, k, (1, 3), tuning=tune)
    assert_run_is_one_columns_bits(device, tune, 33, name, m, k)


@pytest.mark.parametrize("name,rows,cols", [("Q4_0", 4, 8), ("Q4_K", 1, 3), ("Q6_K", 2, 1), ("F16", 4, 4)])
def test_sum_scatter(device, name, rows, cols):
    """mv_sum_scatter: a dense mat-vec whose row's lanes are whole subgroups sums them by a
    reduce-scatter: the reference's sums, every column's one-column bits in a run of columns (1 to
    32 values a lane: halving levels, then butterfly steps), and only for mul_mv."""
    from vkrt.ops.mat_vec import mat_vec_variant
    sg, typ, k, m = device.profile.subgroup_max, ggml_type(name), 4 * k_for(name), 37
    tune = dataclasses.replace(device.tuning, mv_wg=4 * sg, mv_rows=rows, mv_rows_multi=0, mv_fill_groups=1,
                               mv_rows_by_type=(), mv_rows_one_column_by_type=(), mv_lanes_threads=0,
                               mv_dense_max_n=cols, mv_max_n=max(cols, 2), mv_sum_scatter=True)
    defines = mat_vec_variant(device, typ, cols, tune, k=k, m=m, xvec4=True)[0]
    if "REDUCE_SUBGROUP" not in defines:
        pytest.skip(f"{name} rows of {k} give {defines['TPR']} lanes, not whole subgroups")
    assert defines["MV_SCATTER"] == sg and defines["NR"] == rows
    check(device, name, m, k, (1, cols), tuning=tune)
    assert_run_is_one_columns_bits(device, tune, 5, name, m, k, max(cols, 2))


def test_sum_scatter_not_in_a_workgroup_narrower_than_a_subgroup(device):
    """A mat-vec workgroup of half a subgroup (VKRT_TUNE mv_wg) sums by subgroup adds over the lanes
    it has, not by a reduce-scatter whose shuffles would read lanes past it: the reference's sums."""
    from vkrt.ops.mat_vec import mat_vec_variant
    sg = device.profile.subgroup_max
    if sg < 4 or not device.profile.subgroup_arithmetic:
        pytest.skip("needs subgroup adds in subgroups of 4 lanes or more")
    tune = dataclasses.replace(device.tuning, mv_wg=sg // 2, mv_sum_scatter=True, mv_lanes_threads=0)
    defines = mat_vec_variant(device, ggml_type("Q4_0"), 1, tune, k=256, m=16, xvec4=True)[0]
    assert "REDUCE_SUBGROUP" in defines and "MV_SCATTER" not in defines
    check(device, "Q4_0", 16, 256, (1, 3), tuning=tune)


@pytest.mark.parametrize("name,k,cols,gate_up", [("Q4_0", 64, 1, False), ("Q4_0", 64, 3, True), ("Q4_K", 256, 2, False),
                                                 ("F16", 13, 4, True), ("Q6_K", 256, 1, True), ("Q4_0", 32, 8, False)])
def test_cluster_scatter_keeps_the_butterflys_bits(device, name, k, cols, gate_up):
    """mv_sum_scatter where a row's lanes lie within one subgroup (REDUCE_CLUSTER): the
    reduce-scatter adds what the butterfly adds, so every sum (and a fused gate/up's product,
    whose two sums a lane keeps side by side) is bit for bit the butterfly's; 2 to 8 lanes, 4
    rows, 1 to 8 columns (4 to 64 values a lane)."""
    from vkrt.commands import run_once
    from vkrt.ops.mat_vec import mat_vec_variant
    sg = device.profile.subgroup_max
    if not device.profile.subgroup_shuffle:
        pytest.skip("no subgroup shuffles: no shuffle clusters")
    base = dataclasses.replace(device.tuning, mv_wg=sg, mv_rows=4, mv_rows_multi=0, mv_fill_groups=1,
                               mv_rows_by_type=(), mv_rows_one_column_by_type=(), mv_lanes_threads=0,
                               mv_dense_max_n=cols, mv_max_n=max(cols, 2))
    typ, m = ggml_type(name), 19
    defines = mat_vec_variant(device, typ, cols, dataclasses.replace(base, mv_sum_scatter=True), k=k, m=m,
                              xvec4=False, gate_up="silu" if gate_up else None)[0]
    assert "REDUCE_CLUSTER" in defines and defines["MV_SCATTER"] == defines["TPR"] > 1
    rng = np.random.default_rng(k + cols)
    both = weight_tensor(device, name, random_blocks(name, 2 * m, k, rng, scale=0.5), (k, 2 * m))
    gate, up = both.slice(1, 0, m), both.slice(1, m, 2 * m)
    x = tensor_from_numpy(device, rng.standard_normal((cols, k)).astype(np.float32))
    outs = [Tensor.empty(device, "F32", (m, cols)) for _ in range(2)]
    try:
        for on, y in zip((False, True), outs):
            tune = dataclasses.replace(base, mv_sum_scatter=on)
            run_once(device, lambda seq: matmul(seq, gate, x, y, up_weight=up if gate_up else None, tuning=tune))
        a, b = (read_tensor(y) for y in outs)
        assert np.isfinite(a).all() and np.abs(a).max() > 0
        np.testing.assert_array_equal(b.view(np.uint32), a.view(np.uint32))
    finally:
        for t in (both, x, *outs):
            t.close()


def test_rows_halved_until_the_grid_fills(device):
    """Short matrices take fewer rows a group (down to one) until the grid has mv_fill_groups
    workgroups; the grid's z extent (mul_mat_id's token-slot pairs) counts. Results unchanged."""
    from vkrt.ops.mat_vec import mat_vec_variant
    tune = dataclasses.replace(device.tuning, mv_wg=64, mv_rows=4, mv_rows_by_type=(), mv_fill_groups=40)
    q = ggml_type("Q4_0")   # k = 2048: 256 units, 64 lanes a row, one group a workgroup
    rows = lambda m, layers=1: mat_vec_variant(device, q, 1, tune, k=2048, m=m, layers=layers,
                                               xvec4=True)[0]["NR"]
    assert (rows(160), rows(100), rows(30), rows(30, layers=8)) == (4, 2, 1, 4)
    check(device, "Q4_0", 30, 2048, (1, 2), tuning=tune)

def test_single_row(device):
    check(device, "Q6_K", 1, 256, (1, 3, 70))


@pytest.mark.parametrize("name", ["Q5_1", "Q3_K", "F16"])
def test_row_ranges_when_larger_than_a_binding(device, name):
    """A binding limit of a few rows: the weight is bound and dispatched in row ranges."""
    k = k_for(name)
    row = ggml_type(name).row_bytes(k)
    check(device, name, 50, k, (1, 4, 20), max_binding=7 * row + 64)


def test_strided_operands(device):
    """x read through a view that is not vec4-aligned, y written into a wider buffer."""
    rng = np.random.default_rng(5)
    m, k, n = 20, 64, 12
    raw = random_blocks("Q8_0", m, k, rng, scale=0.5)
    wf = reference("Q8_0", raw).astype(np.float64)
    w = weight_tensor(device, "Q8_0", raw, (k, m))
    wide = rng.standard_normal((n, k + 3)).astype(np.float32)
    xt = tensor_from_numpy(device, wide)
    yt = Tensor.empty(device, "F32", (m + 5, n))
    try:
        for cols in (3, n):
            x = xt.slice(0, 1, k + 1).slice(1, 0, cols)       # starts one float in: scalar loads
            y = yt.slice(0, 2, m + 2).slice(1, 0, cols)
            got = run(device, w, wide[:cols, 1:k + 1], m, x=x, y=y)
            assert nmse(got, wide[:cols, 1:k + 1].astype(np.float64) @ wf.T) < gemm_limit(THRESHOLD["Q8_0"], device.tuning)
    finally:
        for t in (w, xt, yt):
            t.close()


def test_shape_errors(device):
    w = Tensor.empty(device, "Q4_0", (64, 8))
    x = Tensor.empty(device, "F32", (32, 2))
    y = Tensor.empty(device, "F32", (8, 2))
    try:
        with CommandSequence(device) as seq, pytest.raises(UnsupportedShape, match="ne\\[0\\] = 64"):
            with seq.record():
                matmul(seq, w, x, y)
    finally:
        for t in (w, x, y):
            t.close()


@pytest.mark.slow
def test_output_matrix_larger_than_a_binding(device):
    """gemma3's 262144 x 640 output matrix in Q8_0 (178 MB) exceeds lavapipe's 128 MiB storage
    range: it is bound in row ranges, for decode and for a small batch."""
    m, k = 262144, 640
    rng = np.random.default_rng(11)
    nblk = k // 32
    q = rng.integers(-127, 128, (m, nblk, 32), dtype=np.int8)
    d = (rng.uniform(-1, 1, (m, nblk)) * 0.01).astype(np.float16)
    raw = np.concatenate([d.view(np.uint8).reshape(m, nblk, 2), q.view(np.uint8)], axis=2).reshape(m, nblk * 34)
    w = weight_tensor(device, "Q8_0", raw, (k, m))
    assert w.nbytes > device.profile.max_storage_buffer_range or device.profile.max_storage_buffer_range > 1 << 28
    x = rng.standard_normal((10, k)).astype(np.float32)
    try:
        for n in (1, 10):
            got = run(device, w, x[:n], m)
            ref = np.empty((n, m))
            for a in range(0, m, 32768):
                wf = (q[a:a + 32768].astype(np.float64) * d[a:a + 32768, :, None].astype(np.float64)).reshape(-1, k)
                ref[:, a:a + 32768] = x[:n].astype(np.float64) @ wf.T
            assert nmse(got, ref) < gemm_limit(THRESHOLD["Q8_0"], device.tuning)
    finally:
        w.close()


@pytest.mark.parametrize("name,k,n,act", [("Q4_K", 512, 1, "silu"), ("Q6_K", 256, 2, "gelu"), ("Q4_0", 64, 3, "silu"),
                                          ("Q8_0", 2048, 1, "silu"), ("F16", 13, 1, "gelu"),
                                          ("MXFP4", 64, 2, "swiglu_oai"), ("Q4_K", 512, 6, "silu"),
                                          ("Q6_K", 256, 11, "gelu"), ("F16", 13, 5, "silu")])
def test_fused_gate_up_is_bit_identical(device, name, k, n, act):
    """matmul(W, x, up_weight=U) against W·x and U·x apart then the activation, bit for bit, in
    runs of at most 4 columns as the plain mat-vecs (5, 6 and 11 columns: several runs); gate and
    up rows of one tensor (one buffer), 19 rows (a part group); an up weight of another shape, or
    more columns than a mat-vec takes (mv_chunk_n), is refused with a clear error."""
    import dataclasses

    from vkrt.commands import run_once
    from vkrt.ops.elementwise import activation
    tune = dataclasses.replace(device.tuning, mv_max_n=8, mv_dense_max_n=4, mv_chunk_n=16)
    m = 19
    rng = np.random.default_rng(k + n)
    both = weight_tensor(device, name, random_blocks(name, 2 * m, k, rng, scale=0.5), (k, 2 * m))
    gate, up = both.slice(1, 0, m), both.slice(1, m, 2 * m)
    x = tensor_from_numpy(device, rng.standard_normal((n, k)).astype(np.float32) * 2)
    g, u, h1, h2 = (Tensor.empty(device, "F32", (m, n)) for _ in range(4))
    other = both.slice(1, 0, m - 1)
    wide_x, wide_h = Tensor.empty(device, "F32", (k, 17)), Tensor.empty(device, "F32", (m, 17))
    try:
        run_once(device, lambda seq: (matmul(seq, gate, x, g, tuning=tune), matmul(seq, up, x, u, tuning=tune),
                                      activation(seq, act, g, h1, up=u)))
        run_once(device, lambda seq: matmul(seq, gate, x, h2, up_weight=up, act=act, tuning=tune))
        np.testing.assert_array_equal(read_tensor(h2).view(np.uint32), read_tensor(h1).view(np.uint32))
        with pytest.raises(UnsupportedShape, match="one pass"):
            run_once(device, lambda seq: matmul(seq, gate, x, h2, up_weight=other, act=act, tuning=tune))
        with pytest.raises(UnsupportedShape, match="at most 16 columns"):
            run_once(device, lambda seq: matmul(seq, gate, wide_x, wide_h, up_weight=up, act=act, tuning=tune))
    finally:
        for t in (both, x, g, u, h1, h2, wide_x, wide_h):
            t.close()


@pytest.mark.parametrize("name,n", [("Q4_K", 1), ("Q4_K", 3), ("Q5_K", 1), ("Q5_K", 3)])
def test_wide_loads_are_bit_identical(device, name, n):
    """Q4_K and Q5_K units (and block headers) loaded 16 bytes at once (aligned weights) against
    word loads, bit for bit; a weight at an offset that is not 16-byte aligned takes the word loads."""
    from vkrt.ops.mat_vec import mat_vec_variant, wide_ok
    rng = np.random.default_rng(n)
    m, k = 37, 512
    w = weight_tensor(device, name, random_blocks(name, m + 1, k, rng, scale=0.5), (k, m + 1))
    x = rng.standard_normal((n, k)).astype(np.float32)
    try:
        tunings = [dataclasses.replace(device.tuning, mv_wide=on, mv_narrow_types=()) for on in (False, True)]
        outs = [run(device, w.slice(1, 1, m + 1), x, m, tuning=t) for t in tunings]
        np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
        assert wide_ok(w.type, w.offset, w.nb[1]) and not wide_ok(w.type, 72) and not wide_ok(ggml_type("Q6_K"), 0)

        def defines(t):
            return mat_vec_variant(device, w.type, n, t, k=k, m=m, xvec4=True, wide=True)[0]
        assert "QWIDE" in defines(tunings[1]) and "QWIDE" not in defines(tunings[0])
        assert "QWIDE" not in defines(dataclasses.replace(tunings[1], mv_narrow_types=(name,)))
    finally:
        w.close()


def coopmat_tuning(device):
    if not device.tuning.mm_coopmat:
        pytest.skip(f"{device.profile.name}: its tuning runs no GEMM on cooperative matrices "
                    "(VK_KHR_cooperative_matrix with 16x16x16 fp16 products)")
    return dataclasses.replace(device.tuning, mv_chunk_n=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name,k", [("Q4_K", 768), ("Q6_K", 512), ("Q4_0", 160), ("Q8_0", 96), ("F16", 200),
                                    ("F32", 101), ("IQ2_XXS", 512), ("MXFP4", 160)])
def test_coopmat_gemm(device, name, k):
    """The GEMM on cooperative matrices: 67 rows (a partial row tile), K not always a multiple of
    BK, 9 to 130 tokens (partial token tiles); the tuning row's tile, 2x2 subgroups of one
    fragment each, and split along K; within fp16 operands' error, where the fp32 GEMM on the
    same device keeps its own threshold."""
    t = coopmat_tuning(device)
    check(device, name, 67, k, (9, 64, 130), tuning=t)
    check(device, name, 67, k, (40, 100), tuning=dataclasses.replace(t, mm_cm_wm=16, mm_cm_wn=16, mm_bm=32,
                                                                         mm_bn=32, mm_bk=16))
    check(device, name, 67, k, (20, 64), tuning=dataclasses.replace(t, mm_split_groups=64, mm_split_min_steps=2,
                                                                     mm_bk=16))
    check(device, name, 67, k, (64,), tuning=dataclasses.replace(t, mm_coopmat=False, mm_bk=16))


@pytest.mark.parametrize("extra", [{}, {"SPLIT_K": 1}, {"MUL_MAT_ID": 1}, {"XVEC4": 1}])
def test_coopmat_gemm_compiles(extra):
    """Every variant of the cooperative-matrix GEMM compiles (lavapipe cannot run it)."""
    from vkrt.pipeline.compiler import compile_shader
    for qtype in ("Q4_K", "Q4_0", "F32", "IQ3_S"):
        defines = {f"QTYPE_{qtype}": 1, "BM": 64, "BN": 64, "BK": 32, "COOPMAT": 1, "WM": 32, "WN": 32, "SGS": 32}
        assert compile_shader("mul_mm", {**defines, **extra})


def test_coopmat_needs_the_device(device):
    """The NVIDIA row asks for cooperative matrices (GEMM and prompt flash attention); a device
    without fp16 ones (lavapipe) resolves both off and keeps the fp32 tile; one with them takes the coopmat tile. A tile the fragments do
    not divide is refused by name; VKRT_COOPMAT forces it either way."""
    from vkrt.device.architecture import Arch
    from vkrt.device.tuning import TABLE
    from vkrt.errors import ConfigError, UnsupportedDevice
    from vkrt.ops.matmul import gemm_kernel
    row = TABLE[Arch.NVIDIA]
    assert row.mm_coopmat and row.fa_coopmat
    without = dataclasses.replace(device.profile, coopmat_f16=False)
    off = row.resolved(without)
    assert not off.mm_coopmat and not off.fa_coopmat
    assert (off.mm_bm, off.mm_bn, off.mm_bk) == (row.mm_bm, row.mm_bn, row.mm_bk)
    with_cm = dataclasses.replace(device.profile, coopmat_f16=True, fp16_math=True, memory_model=True,
                                  subgroup_min=32, subgroup_max=32)
    on = row.resolved(with_cm)
    assert on.mm_coopmat and on.fa_coopmat and (on.mm_bm, on.mm_bn, on.mm_bk) == (row.mm_cm_bm, row.mm_cm_bn, row.mm_cm_bk)
    with pytest.raises(ConfigError, match="16x16x16"):
        gemm_kernel(device, ggml_type("Q4_0"), dataclasses.replace(on, mm_cm_wm=24), xvec4=True)
    # VKRT_COOPMAT: 0 keeps the fp32 GEMM and its tile on a capable device; 1 is refused by name
    # where the device lacks what it needs, and turns it on for a row that leaves it off
    forced_off = row.resolved(with_cm, coopmat=False)
    assert not forced_off.mm_coopmat and not forced_off.fa_coopmat and (forced_off.mm_bm, forced_off.mm_bk) == (row.mm_bm, row.mm_bk)
    with pytest.raises(UnsupportedDevice, match="VKRT_COOPMAT=1.*16x16x16 fp16 cooperative matrices"):
        row.resolved(without, coopmat=True)
    forced_on = TABLE[Arch.OTHER].resolved(with_cm, coopmat=True)
    assert forced_on.mm_coopmat and forced_on.fa_coopmat
