"""concat against numpy: the generic kernel along every dim with conversions and views; the
transposed-source fast path bit-identical to the generic one on everything it accepts; the
guards send everything else to the generic path, which is still right."""

import dataclasses

import numpy as np
import pytest

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.device import TABLE, Arch
from vkrt.errors import GGMLTypeError, OutOfRange, VkrtError
from vkrt.memory import BF16, F16, F32, I32, Tensor
from vkrt.ops.concat import FastPlan, concat, fast_plan
from vkrt.ops.copy import copy

FAST_TYPES = [F32, F16, I32, BF16]



def random_bits(typ, shape, seed) -> np.ndarray:
    bits = np.random.default_rng(seed).integers(0, 2 ** (8 * typ.type_size), size=shape, dtype=np.uint64)
    return bits.astype(np.uint32 if typ.type_size == 4 else np.uint16).view(typ.dtype)


def random_values(typ, shape, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if typ == I32:
        return rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)
    x = rng.standard_normal(shape).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16) if typ == BF16 else x.astype(typ.dtype)


def as_float(x: np.ndarray, typ) -> np.ndarray:
    """Host values of `typ` as f32 (BF16 bit patterns widened)."""
    return (x.astype(np.uint32) << 16).view(np.float32) if typ == BF16 else x.astype(np.float32)


def same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def numpy_concat(a, b, dim):
    """GGML dim -> numpy axis of 4-D arrays."""
    return np.concatenate([a, b], axis=3 - dim)


# -- generic kernel -------------------------------------------------------------------------------

@pytest.mark.parametrize("typ", [F32, F16, I32], ids=lambda t: t.name)
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
@pytest.mark.parametrize("ne_a, n_b", [((1, 1, 1, 1), 1), ((31, 33, 2, 1), 33), ((1001, 3, 1, 2), 1),
                                       ((5, 1, 3, 31), 2)], ids=str)
def test_generic_along_every_dim(device, typ, dim, ne_a, n_b):
    ne_b = list(ne_a)
    ne_b[dim] = n_b
    ne_d = list(ne_a)
    ne_d[dim] += n_b
    x = random_bits(typ, tuple(reversed(ne_a)), dim)
    y = random_bits(typ, tuple(reversed(ne_b)), dim + 10)
    a, b = tensor_from_numpy(device, x, typ=typ), tensor_from_numpy(device, y, typ=typ)
    dst = Tensor.empty(device, typ, ne_d)
    try:
        assert run_once(device, lambda seq: concat(seq, a, b, dst, dim)) == "generic"
        assert same_bits(read_tensor(dst), numpy_concat(x, y, dim))
    finally:
        for t in (a, b, dst):
            t.close()


@pytest.mark.parametrize("ta, tb, td", [(F16, F32, F32), (F32, F16, F16), (BF16, F32, F32), (F32, BF16, F16),
                                        (F16, F16, F32)], ids=str)
def test_generic_mixed_types_convert(device, ta, tb, td):
    x, y = random_values(ta, (3, 33, 31), 1), random_values(tb, (3, 33, 5), 2)   # ne (31|5, 33, 3)
    a, b = tensor_from_numpy(device, x, typ=ta), tensor_from_numpy(device, y, typ=tb)
    dst = Tensor.empty(device, td, (36, 33, 3))
    try:
        assert run_once(device, lambda seq: concat(seq, a, b, dst, 0)) == "generic"
        want = np.concatenate([as_float(x, ta), as_float(y, tb)], axis=2).astype(td.dtype)
        assert same_bits(read_tensor(dst), want)
    finally:
        for t in (a, b, dst):
            t.close()


def test_generic_strided_views_and_offsets(device):
    """a: a permuted view; b: a slice at an odd element offset; dst: a window of a larger
    tensor whose other elements stay untouched."""
    x = random_values(F16, (4, 33, 31), 3)                         # ne (31, 33, 4)
    y = random_values(F16, (7, 33, 5), 4)                          # ne (5, 33, 7)
    fill = random_values(F16, (40, 35, 6), 5)                      # ne (6, 35, 40)
    ta, tb, outer = (tensor_from_numpy(device, v) for v in (x, y, fill))
    a = ta.permute(2, 1, 0, 3)                                     # ne (4, 33, 31)
    b = tb.slice(0, 1, 5).slice(2, 0, 6)                           # ne (4, 33, 6), element offset 1
    dst = outer.slice(0, 1, 5).slice(1, 1, 34).slice(2, 2, 39)     # ne (4, 33, 37)
    try:
        assert a.ne == (4, 33, 31, 1) and b.ne == (4, 33, 6, 1) and dst.ne == (4, 33, 37, 1)
        assert run_once(device, lambda seq: concat(seq, a, b, dst, 2)) == "generic"
        expect = fill.copy()
        expect[2:39, 1:34, 1:5] = np.concatenate([x.transpose(2, 1, 0), y[0:6, :, 1:5]], axis=0)
        assert same_bits(read_tensor(outer), expect)
    finally:
        for t in (ta, tb, outer):
            t.close()


# -- the transposed-source fast path --------------------------------------------------------------

class Case:
    """a ++ b along dim 0 where one source is stored transposed: `ctg` (rows x ctg_cols, row-major)
    and `trp` (rows x trp_cols, stored as trp_cols rows of `rows`), each at an element offset
    inside a larger allocation; dst is a contiguous window of a padded allocation."""

    def __init__(self, device, typ, rows, ctg_cols, trp_cols, transposed="second", offset=0, seed=0):
        self.typ = typ
        size = typ.type_size
        host_c = random_bits(typ, (offset + rows * ctg_cols,), seed)
        host_t = random_bits(typ, (offset + 1 + rows * trp_cols,), seed + 1)
        self.ctg_np = host_c[offset:].reshape(rows, ctg_cols)
        self.trp_np = host_t[offset + 1:].reshape(trp_cols, rows).T
        self.owned = [tensor_from_numpy(device, host_c, typ=typ), tensor_from_numpy(device, host_t, typ=typ)]
        ctg = self.owned[0].view((ctg_cols, rows), offset=offset * size)
        trp = self.owned[1].view((rows, trp_cols), offset=(offset + 1) * size).transpose()
        self.a, self.b = (ctg, trp) if transposed == "second" else (trp, ctg)
        self.np_a, self.np_b = (self.ctg_np, self.trp_np) if transposed == "second" else (self.trp_np, self.ctg_np)
        self.ne = (ctg_cols + trp_cols, rows)
        self.pad = offset + 2
        self.device = device

    def want(self):
        return np.concatenate([self.np_a, self.np_b], axis=1)

    def run(self, path):
        """(path taken, dst contents); checks the padding around dst was not touched."""
        n = self.ne[0] * self.ne[1]
        fill = random_bits(self.typ, (n + 2 * self.pad,), 99)
        outer = tensor_from_numpy(self.device, fill, typ=self.typ)
        try:
            dst = outer.view(self.ne, offset=self.pad * self.typ.type_size)
            taken = run_once(self.device, lambda seq: concat(seq, self.a, self.b, dst, 0, path=path))
            got = read_tensor(outer)
            assert same_bits(got[:self.pad], fill[:self.pad]) and same_bits(got[-self.pad:], fill[-self.pad:])
            return taken, got[self.pad:-self.pad].reshape(self.ne[1], self.ne[0])
        finally:
            outer.close()

    def close(self):
        for t in self.owned:
            t.close()


# (rows, ctg_cols, trp_cols); a transposed source of one row or one column is contiguous
FAST_SHAPES = [(2, 1, 2), (31, 33, 2), (33, 1, 31), (1000, 31, 33), (70, 64, 33), (33, 2, 1031)]


@pytest.mark.parametrize("typ", FAST_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("transposed", ["first", "second"])
@pytest.mark.parametrize("rows, ctg_cols, trp_cols", FAST_SHAPES, ids=str)
def test_fast_path_bit_identical_to_generic(device, typ, transposed, rows, ctg_cols, trp_cols):
    case = Case(device, typ, rows, ctg_cols, trp_cols, transposed, offset=rows % 3, seed=rows + ctg_cols)
    try:
        assert isinstance(fast_plan(case.a, case.b, case.a.view(case.ne), 0), FastPlan)
        taken_fast, fast = case.run("auto")
        taken_generic, generic = case.run("generic")
        assert (taken_fast, taken_generic) == ("fast", "generic")
        assert same_bits(fast, generic)
        assert same_bits(fast, case.want())
    finally:
        case.close()


def test_fast_path_at_the_bench_shape(device):
    case = Case(device, F16, 4096, 512, 64, "second", offset=1)
    try:
        taken, got = case.run("fast")
        assert taken == "fast" and same_bits(got, case.want())
    finally:
        case.close()


def test_fast_path_other_tilings(device, monkeypatch):
    """GCN's tuning, rows per pass that do not divide the tile, and a grid folded into rows."""
    for tuning in (TABLE[Arch.AMD_GCN].resolved(device.profile), dataclasses.replace(device.tuning, transpose_rows=3)):
        monkeypatch.setattr(device, "tuning", tuning)
        case = Case(device, F32, 100, 33, 70, "first", offset=2)
        try:
            assert same_bits(case.run("fast")[1], case.want())
        finally:
            case.close()
    monkeypatch.undo()
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, max_workgroup_count=(7, 1000, 1)))
    case = Case(device, F16, 65, 40, 33, "second", offset=1)
    try:
        assert same_bits(case.run("fast")[1], case.want())
    finally:
        case.close()


def test_fast_path_without_16bit_storage(device, monkeypatch):
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, storage_16bit=False))
    case = Case(device, F16, 37, 33, 31, "second", offset=1)
    try:
        taken, fast = case.run("auto")
        assert taken == "fast" and same_bits(fast, case.want()) and same_bits(case.run("generic")[1], fast)
    finally:
        case.close()


def test_generic_forced(device):
    case = Case(device, F32, 33, 31, 33)
    try:
        assert case.run("auto")[0] == "fast"
        taken, got = case.run("generic")
        assert taken == "generic" and same_bits(got, case.want())
    finally:
        case.close()


# -- cases the guards reject: generic path, still correct -----------------------------------------

def _dim1(device, made):
    """Concat along dim 1 of a transposed source and a contiguous one."""
    x, y = random_bits(F32, (31, 40), 1), random_bits(F32, (33, 31), 2)
    t, c = tensor_from_numpy(device, x), tensor_from_numpy(device, y)
    made += [t, c]
    return t.transpose(), c, 1, np.concatenate([x.T, y], axis=0), F32


def _mixed(device, made):
    x, y = random_values(F16, (33, 31), 1), random_values(F32, (31, 5), 2)
    t, c = tensor_from_numpy(device, x), tensor_from_numpy(device, y)
    made += [t, c]
    return t.transpose(), c, 0, np.concatenate([x.T.astype(np.float32), y], axis=1), F32


def _three_d(device, made):
    x, y = random_bits(F16, (2, 33, 31), 1), random_bits(F16, (2, 31, 7), 2)   # x: ne (31, 33, 2)
    t, c = tensor_from_numpy(device, x), tensor_from_numpy(device, y)
    made += [t, c]
    return t.permute(1, 0, 2, 3), c, 0, np.concatenate([x.transpose(0, 2, 1), y], axis=2), F16


def _both_transposed(device, made):
    x, y = random_bits(F32, (33, 31), 1), random_bits(F32, (5, 31), 2)
    t, u = tensor_from_numpy(device, x), tensor_from_numpy(device, y)
    made += [t, u]
    return t.transpose(), u.transpose(), 0, np.concatenate([x.T, y.T], axis=1), F32


def _not_tight(device, made):
    """A transposed view of a column block: nb[0] is a whole column of 40, ne[1] only 31."""
    x, y = random_bits(I32, (33, 40), 1), random_bits(I32, (31, 2), 2)
    t, c = tensor_from_numpy(device, x), tensor_from_numpy(device, y)
    made += [t, c]
    return t.transpose().slice(1, 4, 35), c, 0, np.concatenate([x.T[4:35], y], axis=1), I32


def _both_contiguous(device, made):
    x, y = random_bits(F16, (31, 33), 1), random_bits(F16, (31, 3), 2)
    a, b = tensor_from_numpy(device, x), tensor_from_numpy(device, y)
    made += [a, b]
    return a, b, 0, np.concatenate([x, y], axis=1), F16


def _one_column_transposed(device, made):
    """A 'transposed' source with one column is contiguous: nothing to gain, generic path."""
    x, y = random_bits(F32, (1, 31), 1), random_bits(F32, (31, 4), 2)
    t, c = tensor_from_numpy(device, x), tensor_from_numpy(device, y)
    made += [t, c]
    return t.transpose(), c, 0, np.concatenate([x.T, y], axis=1), F32


REJECTED = [(_dim1, "dim 1"), (_mixed, "mixed types"), (_three_d, "not 2-D"), (_both_transposed, "one contiguous"),
            (_not_tight, "one contiguous"), (_both_contiguous, "one contiguous"),
            (_one_column_transposed, "one contiguous")]


@pytest.mark.parametrize("build, reason", REJECTED, ids=[b.__name__.strip("_") for b, _ in REJECTED])
def test_guard_rejects_and_generic_is_correct(device, build, reason):
    made = []
    try:
        a, b, dim, want, typ = build(device, made)
        dst = Tensor.empty(device, typ, tuple(reversed(want.shape)))
        made.append(dst)
        assert reason in fast_plan(a, b, dst, dim)
        with pytest.raises(VkrtError, match="fast path does not apply"):
            run_once(device, lambda seq: concat(seq, a, b, dst, dim, path="fast"))
        assert run_once(device, lambda seq: concat(seq, a, b, dst, dim)) == "generic"
        assert same_bits(read_tensor(dst), want)
    finally:
        for t in made:
            t.close()


def test_guard_rejects_strided_destination(device):
    case = Case(device, F32, 33, 5, 31)
    outer = tensor_from_numpy(device, np.zeros((33, 40), np.float32))
    try:
        dst = outer.slice(0, 2, 38)
        assert "destination is not contiguous" in fast_plan(case.a, case.b, dst, 0)
        assert run_once(device, lambda seq: concat(seq, case.a, case.b, dst, 0)) == "generic"
        expect = np.zeros((33, 40), np.float32)
        expect[:, 2:38] = case.want()
        assert same_bits(read_tensor(outer), expect)
    finally:
        case.close()
        outer.close()


def test_too_big_for_one_binding_takes_the_split_generic_path(device, monkeypatch):
    case = Case(device, F16, 70, 33, 40, "first", offset=1)
    try:
        want = case.want()
        monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, max_storage_buffer_range=1024))
        assert "does not fit one storage-buffer binding" in fast_plan(case.a, case.b, case.a.view(case.ne), 0)
        taken, got = case.run("auto")
        monkeypatch.undo()
        assert taken == "generic" and same_bits(got, want)
    finally:
        case.close()


def test_destination_spanning_more_than_a_binding(device, lavapipe_binding_limit):
    """dst: a 40 x 30 window whose rows lie 4.5 MiB apart (~131 MiB span), written along dim 0,
    then cleared and written again seen transposed, along dim 1."""
    row = 9 << 19
    big = Tensor.empty(device, F32, (row // 4, 30))
    x, y = random_bits(F32, (30, 33), 1), random_bits(F32, (30, 7), 2)
    want = np.concatenate([x, y], axis=1)
    made = [big] + [tensor_from_numpy(device, v) for v in (x, y, x[:, :10].T.copy(), want[:, 10:].T.copy(),
                                                           np.zeros((30, 40), np.float32))]
    a, b, cols_a, cols_b, zeros = made[1:]
    back = Tensor.empty(device, F32, (40, 30))
    made.append(back)
    try:
        dst = big.view((40, 30), nb=(4, row), offset=8)
        assert dst.span > device.profile.max_storage_buffer_range
        assert run_once(device, lambda seq: (concat(seq, a, b, dst, 0), copy(seq, dst, back))[0]) == "generic"
        assert same_bits(read_tensor(back), want)
        run_once(device, lambda seq: (copy(seq, zeros, dst), copy(seq, dst, back)))
        assert not read_tensor(back).any()
        run_once(device, lambda seq: (concat(seq, cols_a, cols_b, dst.transpose(), 1), copy(seq, dst, back)))
        assert same_bits(read_tensor(back), want)
    finally:
        for t in made:
            t.close()


def test_concat_errors(device):
    made = [Tensor.empty(device, *spec) for spec in ((F32, (4, 3)), (F32, (2, 3)), (F32, (6, 3)), (I32, (2, 3)),
                                                     (F32, (6, 4)), ("Q8_0", (32, 3)))]
    a, b, dst, ib, wrong, q8 = made
    try:
        with pytest.raises(OutOfRange, match="dim must be 0..3"):
            concat(None, a, b, dst, 4)
        with pytest.raises(OutOfRange, match="do not give"):
            concat(None, a, b, wrong, 0)
        with pytest.raises(OutOfRange, match="do not give"):
            concat(None, a, b, dst, 1)
        with pytest.raises(GGMLTypeError, match="i32 concatenates only with i32"):
            concat(None, a, ib, dst, 0)
        with pytest.raises(GGMLTypeError):
            concat(None, q8, q8, q8, 0)
        with pytest.raises(VkrtError, match="path must be one of"):
            concat(None, a, b, dst, 0, path="fastest")
    finally:
        for t in made:
            t.close()
