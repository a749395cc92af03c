"""mul_mat_id (mixture-of-experts matmul) against float64 numpy on the dequantised experts."""

import dataclasses

import numpy as np
import pytest
from quant_data import ALL, fp32_tile, gemm_limit, nmse, random_blocks, reference, weight_tensor, wide_tile_pair

from vkrt.commands import CommandSequence, download, read_tensor, tensor_from_numpy, write_tensor
from vkrt.errors import UnsupportedShape
from vkrt.memory import MemoryKind, Tensor, ggml_type
from vkrt.ops.mul_mat_id import RouteTable, mat_vec_tokens, mul_mat_id

THRESHOLD = {name: 1e-11 for name in ("F32", "F16", "BF16")} | {name: 1e-10 for name in ALL[3:]}
N_EXPERT, N_USED = 6, 2


def routing(rng, n_tokens: int, n_expert: int = N_EXPERT, n_used: int = N_USED) -> np.ndarray:
    """Distinct experts per token; the last expert is never chosen."""
    return np.stack([rng.choice(n_expert - 1, n_used, replace=False) for _ in range(n_tokens)]).astype(np.int32)


def reference_product(wf, x, ids):
    n_tokens, n_used = ids.shape
    slots = x.shape[1]
    return np.stack([[wf[ids[t, i]] @ x[t, i % slots].astype(np.float64) for i in range(n_used)]
                     for t in range(n_tokens)])


def run(device, w, x_np, ids_np, m, *, ids=None, routes=None, **kw):
    n_tokens, n_used = ids_np.shape
    x = tensor_from_numpy(device, x_np)
    own_ids = ids is None
    ids = tensor_from_numpy(device, ids_np) if own_ids else ids
    y = Tensor.empty(device, "F32", (m, n_used, n_tokens))
    own_routes = routes is None
    routes = RouteTable(device, w.ne[2], n_tokens) if own_routes else routes
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                mul_mat_id(seq, w, x, ids, y, routes, **kw)
            seq.run()
        return read_tensor(y)
    finally:
        for t in (x, y) + ((ids,) if own_ids else ()) + ((routes,) if own_routes else ()):
            t.close()


def check(device, name, m, k, token_counts, seed=0, n_expert=N_EXPERT, **kw):
    rng = np.random.default_rng(seed)
    raw = random_blocks(name, m * n_expert, k, rng, scale=0.5)
    wf = reference(name, raw).astype(np.float64).reshape(n_expert, m, k)
    w = weight_tensor(device, name, raw, (k, m, n_expert))
    try:
        for n_tokens in token_counts:
            for slots in (1, N_USED):   # one input row shared by the experts (gate/up), or one each (down)
                ids = routing(rng, n_tokens, n_expert)
                x = rng.standard_normal((n_tokens, slots, k)).astype(np.float32)
                got = run(device, w, x, ids, m, **kw)
                err = nmse(got, reference_product(wf, x, ids))
                assert err < gemm_limit(THRESHOLD[name], kw.get("tuning") or device.tuning), f"{name} n_tokens={n_tokens} x_slots={slots}: error {err:.3g}"
    finally:
        w.close()


def k_for(name: str) -> int:
    t = ggml_type(name)
    return 2 * t.block_size if t.block_size == 256 else 3 * t.block_size if t.quantized else 45


@pytest.mark.parametrize("name", ALL)
def test_every_type(device, name):
    """Decode (mat-vec per routed pair) and prefill (route table + GEMM); 37 rows per expert."""
    check(device, name, 37, k_for(name), (1, 3, 9, 40))


@pytest.mark.parametrize("n_tokens", [*range(1, 10), 31, 512])
def test_token_counts(device, n_tokens):
    check(device, "Q4_K", 21, 256, (n_tokens,), seed=n_tokens)


def test_wide_tile_where_experts_average_its_columns(device):
    """mul_mat_id's GEMM takes the wide tile (mm_big_*) where the experts average a narrow tile's
    width (mm_bn) of pairs or more, with the narrow tile's sums bit for bit, against the reference too."""
    narrow, wide = wide_tile_pair(device.tuning, 32)
    m, k = 70, 256
    rng = np.random.default_rng(8)
    w = weight_tensor(device, "Q4_K", random_blocks("Q4_K", m * N_EXPERT, k, rng, scale=0.5), (k, m, N_EXPERT))
    try:
        for n_tokens in (40, 120):   # 13 and 40 pairs an expert
            ids = routing(rng, n_tokens)
            x = rng.standard_normal((n_tokens, N_USED, k)).astype(np.float32)
            a, b = run(device, w, x, ids, m, tuning=narrow), run(device, w, x, ids, m, tuning=wide)
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    finally:
        w.close()
    check(device, "Q4_0", m, 128, (120,), tuning=wide)


def dispatches(device, w, n_tokens: int) -> int:
    """Dispatches mul_mat_id records over stack w for n_tokens tokens: one for the mat-vec, two
    (the route count, the GEMM) otherwise."""
    k, m = w.ne[0], w.ne[1]
    x, y = Tensor.empty(device, "F32", (k, 1, n_tokens)), Tensor.empty(device, "F32", (m, N_USED, n_tokens))
    ids, routes = Tensor.empty(device, "I32", (N_USED, n_tokens)), RouteTable(device, N_EXPERT, n_tokens)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                mul_mat_id(seq, w, x, ids, y, routes)
            return seq.dispatch_count
    finally:
        for t in (x, y, ids, routes):
            t.close()


def test_server_step_sizes_run_the_mat_vec(device):
    """Steps of mv_max_n + 1 .. mv_id_max_n tokens (a server's decode steps of 9-32 slots) run
    the mat-vec, not the GEMM, whose 64-token tile a chosen expert is nearly empty there (issue
    16); past mv_id_max_n the route table and the GEMM. A stack in host memory alike (the bits
    do not depend on the experts' placement)."""
    tune = device.tuning
    assert tune.mv_id_max_n >= 32 > tune.mv_max_n and mat_vec_tokens(tune) == tune.mv_id_max_n
    vram = Tensor.empty(device, "Q8_0", (32, 8, N_EXPERT))
    host = Tensor.empty(device, "Q8_0", (32, 8, N_EXPERT), kind=MemoryKind.HOST)
    try:
        for w in (vram, host):
            got = {n: dispatches(device, w, n) for n in (1, tune.mv_max_n, tune.mv_max_n + 1, 16, tune.mv_id_max_n,
                                                         tune.mv_id_max_n + 1)}
            assert got == {1: 1, tune.mv_max_n: 1, tune.mv_max_n + 1: 1, 16: 1, tune.mv_id_max_n: 1,
                           tune.mv_id_max_n + 1: 2}, w.buffer.kind
    finally:
        vram.close()
        host.close()


@pytest.mark.parametrize("name,n_tokens", [("Q4_0", 12), ("Q4_K", 16), ("Q8_0", 32)])
def test_mat_vec_and_gemm_agree_at_server_step_sizes(device, name, n_tokens):
    """The sizes the mat-vec took over from the GEMM, on both paths against float64 numpy."""
    old = dataclasses.replace(device.tuning, mv_id_max_n=device.tuning.mv_max_n)   # the GEMM past mv_max_n
    for tuning in (None, old):
        check(device, name, 21, k_for(name), (n_tokens,), seed=n_tokens, n_expert=16, tuning=tuning)


def test_route_table_counts(device):
    """The counting pass groups each expert's (token, slot) pairs; unused experts count zero."""
    rng = np.random.default_rng(2)
    n_tokens = 50
    ids_np = routing(rng, n_tokens)
    ids = tensor_from_numpy(device, ids_np)
    routes = RouteTable(device, N_EXPERT, 64)
    raw = random_blocks("Q8_0", 8 * N_EXPERT, 32, rng, scale=0.5)
    w = weight_tensor(device, "Q8_0", raw, (32, 8, N_EXPERT))
    try:
        run(device, w, rng.standard_normal((n_tokens, 1, 32)).astype(np.float32), ids_np, 8, ids=ids, routes=routes)
        table = download(device, routes.whole(), np.uint32)
        counts = table[:N_EXPERT]
        np.testing.assert_array_equal(counts, np.bincount(ids_np.ravel(), minlength=N_EXPERT))
        assert counts[-1] == 0
        for e in range(N_EXPERT):
            entries = sorted(table[N_EXPERT + e * n_tokens:N_EXPERT + e * n_tokens + counts[e]])
            assert entries == sorted(np.flatnonzero(ids_np.ravel() == e))
    finally:
        for t in (ids, routes, w):
            t.close()


@pytest.mark.parametrize("name", ["Q6_K", "Q4_1"])
def test_expert_ranges_when_larger_than_a_binding(device, name):
    """A binding limit of two experts: the stack is bound and dispatched in expert ranges."""
    k, m = k_for(name), 16
    limit = 2 * m * ggml_type(name).row_bytes(k) + 64
    check(device, name, m, k, (2, 20), seed=4, max_binding=limit)


def test_strided_ids(device):
    """Ids as GGML's top-k view of an argsort: n_used columns of rows n_expert wide."""
    rng = np.random.default_rng(6)
    n_tokens, k, m = 12, 64, 10
    order = np.stack([rng.permutation(N_EXPERT) for _ in range(n_tokens)]).astype(np.int32)
    full = tensor_from_numpy(device, order)
    ids = full.slice(0, 0, N_USED)
    raw = random_blocks("Q8_0", m * N_EXPERT, k, rng, scale=0.5)
    wf = reference("Q8_0", raw).astype(np.float64).reshape(N_EXPERT, m, k)
    w = weight_tensor(device, "Q8_0", raw, (k, m, N_EXPERT))
    try:
        for n in (3, n_tokens):
            view = ids.slice(1, 0, n)
            x = rng.standard_normal((n, 1, k)).astype(np.float32)
            got = run(device, w, x, order[:n, :N_USED], m, ids=view)
            assert nmse(got, reference_product(wf, x, order[:n, :N_USED])) < gemm_limit(THRESHOLD["Q8_0"], device.tuning)
    finally:
        for t in (full, w):
            t.close()


def test_k_not_a_multiple_of_the_tile(device):
    tuning = fp32_tile(device.tuning, mm_bm=32, mm_bn=32, mm_bk=64, mm_tm=4, mm_tn=4)
    check(device, "Q5_0", 19, 96, (1, 30), tuning=tuning)


def test_prefill_needs_a_route_table(device):
    n = device.tuning.mv_id_max_n + 1   # the GEMM's sizes
    w = Tensor.empty(device, "Q8_0", (32, 4, N_EXPERT))
    x = Tensor.empty(device, "F32", (32, 1, n))
    ids = Tensor.empty(device, "I32", (N_USED, n))
    y = Tensor.empty(device, "F32", (4, N_USED, n))
    try:
        with CommandSequence(device) as seq, pytest.raises(UnsupportedShape, match="RouteTable"):
            with seq.record():
                mul_mat_id(seq, w, x, ids, y)
    finally:
        for t in (w, x, ids, y):
            t.close()


@pytest.mark.parametrize("name,k,n_tok", [("Q4_K", 256, 2), ("Q4_0", 96, 2), ("Q6_K", 512, 2), ("Q4_0", 96, 16)])
def test_fused_gate_up_is_bit_identical(device, name, k, n_tok):
    """Expert gate and up stacks in one pass with the SiLU-gated product, bit for bit against
    two mul_mat_ids and the activation; also past mv_max_n tokens (up to mv_id_max_n, experts in
    VRAM: the mat-vec's sizes)."""
    from vkrt.commands import run_once
    from vkrt.ops.elementwise import activation
    m = 24
    rng = np.random.default_rng(k)
    both = weight_tensor(device, name, random_blocks(name, 2 * N_EXPERT * m, k, rng, scale=0.5), (k, m, 2 * N_EXPERT))
    gate, up = both.slice(2, 0, N_EXPERT), both.slice(2, N_EXPERT, 2 * N_EXPERT)
    ids = tensor_from_numpy(device, routing(rng, n_tok))
    x = tensor_from_numpy(device, rng.standard_normal((n_tok, 1, k)).astype(np.float32))
    g, u, h1, h2 = (Tensor.empty(device, "F32", (m, N_USED, n_tok)) for _ in range(4))
    try:
        run_once(device, lambda seq: (mul_mat_id(seq, gate, x, ids, g), mul_mat_id(seq, up, x, ids, u),
                                      activation(seq, "silu", g, h1, up=u)))
        run_once(device, lambda seq: mul_mat_id(seq, gate, x, ids, h2, up_weight=up))
        np.testing.assert_array_equal(read_tensor(h2).view(np.uint32), read_tensor(h1).view(np.uint32))
    finally:
        for t in (both, ids, x, g, u, h1, h2):
            t.close()


def summed_down_inputs(device, name, k, m, n_tok, rng):
    """An expert down stack (k x m, N_EXPERT of type `name`), routing ids, activations and routing
    weights, as device tensors."""
    w = weight_tensor(device, name, random_blocks(name, N_EXPERT * m, k, rng, scale=0.5), (k, m, N_EXPERT))
    ids = tensor_from_numpy(device, routing(rng, n_tok))
    x = tensor_from_numpy(device, rng.standard_normal((n_tok, N_USED, k)).astype(np.float32))
    wt = tensor_from_numpy(device, rng.uniform(0, 1, (n_tok, N_USED)).astype(np.float32))
    return w, ids, x, wt


@pytest.mark.parametrize("name,k,n_tok", [("MXFP4", 64, 2), ("Q8_0", 96, 1), ("Q4_K", 256, 20), ("Q4_K", 256, 40)])
def test_bias_is_add_id(device, name, k, n_tok):
    """A per-expert bias (gpt-oss) added in the mat-vec's store, or by add_id after the GEMM (40
    tokens), bit for bit against mul_mat_id then add_id; a bias of another shape is refused."""
    from vkrt.commands import run_once
    from vkrt.ops.add_id import add_id
    m = 22
    rng = np.random.default_rng(k + n_tok)
    w = weight_tensor(device, name, random_blocks(name, N_EXPERT * m, k, rng, scale=0.5), (k, m, N_EXPERT))
    ids = tensor_from_numpy(device, routing(rng, n_tok))
    x = tensor_from_numpy(device, rng.standard_normal((n_tok, N_USED, k)).astype(np.float32))
    b = tensor_from_numpy(device, rng.standard_normal((N_EXPERT, m)).astype(np.float32))
    y1, y2 = (Tensor.empty(device, "F32", (m, N_USED, n_tok)) for _ in range(2))
    routes = RouteTable(device, N_EXPERT, n_tok)
    try:
        run_once(device, lambda seq: (mul_mat_id(seq, w, x, ids, y1, routes), add_id(seq, y1, b, ids, y1)))
        run_once(device, lambda seq: mul_mat_id(seq, w, x, ids, y2, routes, bias=b))
        np.testing.assert_array_equal(read_tensor(y2).view(np.uint32), read_tensor(y1).view(np.uint32))
        with pytest.raises(UnsupportedShape, match="a bias must be"):
            run_once(device, lambda seq: mul_mat_id(seq, w, x, ids, y2, routes, bias=b.slice(1, 0, N_EXPERT - 1)))
    finally:
        for t in (w, ids, x, b, y1, y2, routes):
            t.close()


def test_biased_gate_up_is_bit_identical(device):
    """gpt-oss's decode FFN: gate and up in one pass with their biases before swiglu_oai, bit for
    bit against the separate mul_mat_ids, add_ids and activation."""
    from vkrt.commands import run_once
    from vkrt.ops.add_id import add_id
    from vkrt.ops.elementwise import activation
    m, k, n_tok, act = 32, 64, 2, "swiglu_oai"
    rng = np.random.default_rng(5)
    both = weight_tensor(device, "MXFP4", random_blocks("MXFP4", 2 * N_EXPERT * m, k, rng, scale=0.5),
                         (k, m, 2 * N_EXPERT))
    gate, up = both.slice(2, 0, N_EXPERT), both.slice(2, N_EXPERT, 2 * N_EXPERT)
    ids = tensor_from_numpy(device, routing(rng, n_tok))
    x = tensor_from_numpy(device, (rng.standard_normal((n_tok, 1, k)) * 3).astype(np.float32))
    bg, bu = (tensor_from_numpy(device, rng.standard_normal((N_EXPERT, m)).astype(np.float32) * 2) for _ in "gu")
    g, u, h1, h2 = (Tensor.empty(device, "F32", (m, N_USED, n_tok)) for _ in range(4))
    try:
        apart = lambda seq: (mul_mat_id(seq, gate, x, ids, g), add_id(seq, g, bg, ids, g),   # noqa: E731
                             mul_mat_id(seq, up, x, ids, u), add_id(seq, u, bu, ids, u))
        run_once(device, lambda seq: (apart(seq), activation(seq, act, g, h1, up=u)))
        run_once(device, lambda seq: mul_mat_id(seq, gate, x, ids, h2, up_weight=up, act=act, bias=bg, up_bias=bu))
        np.testing.assert_array_equal(read_tensor(h2).view(np.uint32), read_tensor(h1).view(np.uint32))
        with pytest.raises(UnsupportedShape, match="up_bias goes with"):
            run_once(device, lambda seq: mul_mat_id(seq, gate, x, ids, h2, up_weight=up, bias=bg))
    finally:
        for t in (both, ids, x, bg, bu, g, u, h1, h2):
            t.close()


def test_routes_counted_once_serve_the_later_stacks(device):
    """A MoE block's gate, up and down share one counting pass: a product over the same ids with
    routes_counted=True records no fill and no mmid_count, and gives the bits of one that counts."""
    rng = np.random.default_rng(21)
    n_tokens, k, m = 40, 64, 24
    assert n_tokens > device.tuning.mv_id_max_n   # the GEMM's sizes
    ws = [random_blocks("Q8_0", m * N_EXPERT, k, rng, scale=0.5) for _ in range(2)]
    w = [weight_tensor(device, "Q8_0", raw, (k, m, N_EXPERT)) for raw in ws]
    ids_np = routing(rng, n_tokens)
    x = tensor_from_numpy(device, rng.standard_normal((n_tokens, 1, k)).astype(np.float32))
    ids = tensor_from_numpy(device, ids_np)
    ys = [Tensor.empty(device, "F32", (m, N_USED, n_tokens)) for _ in range(3)]
    routes = RouteTable(device, N_EXPERT, n_tokens)
    try:
        with CommandSequence(device) as seq:
            with seq.record():
                assert mul_mat_id(seq, w[0], x, ids, ys[0], routes)
                before = seq.dispatch_count
                assert mul_mat_id(seq, w[1], x, ids, ys[1], routes, routes_counted=True)
                assert seq.dispatch_count - before == 1          # the GEMM alone
            seq.run()
        with CommandSequence(device) as seq:
            with seq.record():
                mul_mat_id(seq, w[1], x, ids, ys[2], routes)       # counted afresh
            seq.run()
        got, fresh = read_tensor(ys[1]), read_tensor(ys[2])
        np.testing.assert_array_equal(got.view(np.uint32), fresh.view(np.uint32))
        wf = reference("Q8_0", ws[1]).astype(np.float64).reshape(N_EXPERT, m, k)
        assert nmse(got, reference_product(wf, read_tensor(x).reshape(n_tokens, 1, k), ids_np)) < \
            gemm_limit(THRESHOLD["Q8_0"], device.tuning)
    finally:
        for t in (*w, x, ids, *ys, routes):
            t.close()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Q4_K", "Q4_0", "F16", "IQ3_XXS"])
def test_coopmat_gemm(device, name):
    """mul_mat_id's GEMM on cooperative matrices: experts' gathered token columns through the
    staging fragment, partial token tiles, the tuning row's tile and 2x2 subgroups of one fragment
    each; within fp16 operands' error."""
    if not device.tuning.mm_coopmat:
        pytest.skip(f"{device.profile.name}: its tuning runs no GEMM on cooperative matrices")
    k = max(ggml_type(name).block_size, 64) * 2
    check(device, name, 40, k, (40, 150), tuning=device.tuning)
    small = dataclasses.replace(device.tuning, mm_bm=32, mm_bn=32, mm_bk=16, mm_cm_wm=16, mm_cm_wn=16)
    check(device, name, 40, k, (40, 100), tuning=small)


@pytest.mark.parametrize("name,k,m,n_tok", [("Q4_0", 96, 64, 1), ("Q4_K", 256, 512, 2), ("Q6_K", 256, 128, 3),
                                          ("F16", 13, 96, 1), ("Q4_0", 96, 64, 16)])
@pytest.mark.parametrize("slots,unroll", [(0, False), (1, False), (1, True)])
def test_summed_down_normalises_the_stream_it_added_into(device, name, k, m, n_tok, slots, unroll):
    """The expert down projection summed over a token's slots in one pass (mul_mat_id_sum), added
    into the residual stream, its last workgroup normalising the new stream, against mul_mat_id,
    moe_combine and rms_norm with the residual: the stream and the normed stream bit for bit,
    one to sixteen tokens, a group a slot and one group walking the slots (the loop kept and
    unrolled); the counter left at 0 for the next dispatch."""
    from vkrt.commands import run_once
    from vkrt.ops.matmul import NormOutput, norm_output_fits
    from vkrt.ops.moe import moe_combine
    from vkrt.ops.mul_mat_id import mul_mat_id_sum
    from vkrt.ops.norm import rms_norm
    from vkrt.ops.quant import kernel_type
    prof = device.profile
    if not prof.subgroup_shuffle or prof.subgroup_min != prof.subgroup_max:
        pytest.skip("the norm in the last workgroup needs shuffles and one fixed subgroup size")
    rng = np.random.default_rng(k + m + n_tok)
    w, ids, x, wt = summed_down_inputs(device, name, k, m, n_tok, rng)
    resid = (rng.standard_normal((n_tok, m)) * 2).astype(np.float32)
    nw = tensor_from_numpy(device, (1 + 0.1 * rng.standard_normal(m)).astype(np.float32))
    counter = tensor_from_numpy(device, np.zeros(1, np.int32))
    y = Tensor.empty(device, "F32", (m, N_USED, n_tok))
    o = Tensor.empty(device, "F32", (m, n_tok))
    s1, s2 = tensor_from_numpy(device, resid), tensor_from_numpy(device, resid)
    c1, c2 = Tensor.empty(device, "F32", (m, n_tok)), Tensor.empty(device, "F32", (m, n_tok))
    made = [w, ids, x, wt, nw, counter, y, o, s1, s2, c1, c2]
    try:
        run_once(device, lambda seq: (mul_mat_id(seq, w, x, ids, y), moe_combine(seq, y, wt, o),
                                      rms_norm(seq, s1, c1, 1e-6, nw, residual=o, sum_out=s1)))
        tune = dataclasses.replace(device.tuning, mv_sum_slots=slots, mv_sum_unroll=unroll)
        fits = norm_output_fits(device, m, N_USED, kernel_type(name), k, tune)
        assert fits or slots   # every case fits where the slots go at once
        done = []
        for _ in range(2):   # twice: the counter is back at 0 after each dispatch
            write_tensor(s2, resid)
            run_once(device, lambda seq: done.append(mul_mat_id_sum(
                seq, w, x, ids, wt, s2, NormOutput(nw, 1e-6, c2, counter), tuning=tune)))
            assert done[-1] == fits
            if not fits:   # nothing recorded: the stream as it was
                np.testing.assert_array_equal(read_tensor(s2), resid)
                return
            np.testing.assert_array_equal(read_tensor(s2).view(np.uint32), read_tensor(s1).view(np.uint32))
            np.testing.assert_array_equal(read_tensor(c2).view(np.uint32), read_tensor(c1).view(np.uint32))
        assert read_tensor(counter)[0] == 0
    finally:
        for t in made:
            t.close()


def test_norm_output_only_where_the_slots_go_at_once(device):
    """The last workgroup's norm (NORM_OUT) is refused where one group walks the slots (the plain
    kernel reduces by subgroup adds over its whole workgroup, in subgroups of varying size: a row
    a workgroup, thousands counting in), and taken where groups take them at once: shared-memory
    trees, or subgroup adds in whole subgroups of one fixed size."""
    from types import SimpleNamespace

    from vkrt.ops.mat_vec import mat_vec_lanes, mat_vec_reduce, norm_layout, slots_at_once
    from vkrt.ops.matmul import norm_output_fits
    from vkrt.ops.quant import kernel_type
    prof = device.profile
    lanes = 2 * prof.subgroup_max   # a row's lanes: wider than a subgroup, no shuffle cluster
    typ, k, m = kernel_type("Q4_0"), lanes * 8, 256   # 4 units a 32-element block: a unit a lane
    assert mat_vec_lanes(typ, k, 4 * lanes) == lanes
    if mat_vec_reduce(prof, lanes, lanes) != "subgroup" or norm_layout(device, m, 1, lanes) is None:
        pytest.skip("needs subgroup adds over a workgroup of a row's lanes and the norm's layout there")
    sub = dataclasses.replace(device.tuning, mv_id_wg=lanes)
    fixed = prof.subgroup_min == prof.subgroup_max
    assert slots_at_once(prof, lanes, lanes) == fixed
    varying = SimpleNamespace(profile=dataclasses.replace(prof, subgroup_min=max(1, prof.subgroup_max // 2)),
                              tuning=device.tuning)
    assert not slots_at_once(varying.profile, lanes, lanes)
    assert not norm_output_fits(varying, m, N_USED, typ, k, sub)
    if fixed:
        assert norm_output_fits(device, m, N_USED, typ, k, sub) == (norm_layout(device, m, 1, N_USED * lanes)
                                                                   is not None)
    # a group a slot: subgroup adds in whole subgroups of one fixed size, else shared-memory trees
    at_once = dataclasses.replace(device.tuning, mv_id_wg=2 * lanes)
    assert mat_vec_reduce(prof, lanes, 2 * lanes) == ("subgroup" if fixed else "tree")
    assert mat_vec_reduce(varying.profile, lanes, 2 * lanes) == "tree"
    assert norm_output_fits(device, m, N_USED, typ, k, at_once) == (norm_layout(device, m, 1, 2 * lanes) is not None)


@pytest.mark.parametrize("n_tok", [1, 3])
@pytest.mark.parametrize("scatter", [False, True])
def test_summed_down_in_subgroup_groups_is_bit_identical(device, n_tok, scatter):
    """Where mul_mat_id's workgroup is one row's lanes reducing by subgroup adds (wider than a
    subgroup), the summed down projection gives each slot such a group (whole subgroups) and sums
    as mul_mat_id, moe_combine, the residual add and the norm do, bit for bit; with
    mv_sum_scatter both sum by the reduce-scatter."""
    from vkrt.commands import run_once
    from vkrt.ops.mat_vec import mat_vec_reduce, mat_vec_shape, mat_vec_variant, norm_layout
    from vkrt.ops.matmul import NormOutput
    from vkrt.ops.moe import moe_combine
    from vkrt.ops.mul_mat_id import mul_mat_id_sum
    from vkrt.ops.norm import rms_norm
    from vkrt.ops.quant import kernel_type
    prof = device.profile
    lanes = 2 * prof.subgroup_max
    if (not prof.subgroup_arithmetic or not prof.subgroup_shuffle or prof.subgroup_min != prof.subgroup_max
            or mat_vec_reduce(prof, lanes, lanes) != "subgroup"):
        pytest.skip("needs subgroup adds in subgroups of one fixed size")
    tune = dataclasses.replace(device.tuning, mv_id_wg=lanes, mv_sum_scatter=scatter)
    k = lanes * 8   # Q4_0: a unit a lane
    defines = mat_vec_variant(device, kernel_type("Q4_0"), 1, tune, k=k, m=64, xvec4=True, entry="mul_mv_id")[0]
    assert ("MV_SCATTER" in defines) == scatter and "REDUCE_SUBGROUP" in defines
    wg, got_lanes, _ = mat_vec_shape(device, kernel_type("Q4_0"), 1, tune, k=k, m=64, entry="mul_mv_id_sum",
                                     slots=N_USED)
    assert got_lanes == lanes and wg > lanes   # the slots' groups at once
    # rows whose norm the workgroup's subgroups split evenly
    m = next((m for m in (64, 256, 1024, 2048) if norm_layout(device, m, 1, wg) is not None), None)
    if m is None:
        pytest.skip(f"no norm layout for a workgroup of {wg}")
    rng = np.random.default_rng(n_tok)
    w, ids, x, wt = summed_down_inputs(device, "Q4_0", k, m, n_tok, rng)
    resid = rng.standard_normal((n_tok, m)).astype(np.float32)
    nw = tensor_from_numpy(device, (1 + 0.1 * rng.standard_normal(m)).astype(np.float32))
    counter = tensor_from_numpy(device, np.zeros(1, np.int32))
    y = Tensor.empty(device, "F32", (m, N_USED, n_tok))
    o1 = Tensor.empty(device, "F32", (m, n_tok))
    s1, s2 = tensor_from_numpy(device, resid), tensor_from_numpy(device, resid)
    c1, c2 = Tensor.empty(device, "F32", (m, n_tok)), Tensor.empty(device, "F32", (m, n_tok))
    made = [w, ids, x, wt, nw, counter, y, o1, s1, s2, c1, c2]
    try:
        run_once(device, lambda seq: (mul_mat_id(seq, w, x, ids, y, tuning=tune), moe_combine(seq, y, wt, o1),
                                      rms_norm(seq, s1, c1, 1e-6, nw, residual=o1, sum_out=s1)))
        done = []
        run_once(device, lambda seq: done.append(mul_mat_id_sum(
            seq, w, x, ids, wt, s2, NormOutput(nw, 1e-6, c2, counter), tuning=tune)))
        assert done == [True]
        np.testing.assert_array_equal(read_tensor(s2).view(np.uint32), read_tensor(s1).view(np.uint32))
        np.testing.assert_array_equal(read_tensor(c2).view(np.uint32), read_tensor(c1).view(np.uint32))
    finally:
        for t in made:
            t.close()

@pytest.mark.parametrize("name,k,n_tok,kind", [("Q4_0", 64, 3, "plain"), ("Q4_0", 32, 2, "gate_up"),
                                               ("MXFP4", 64, 2, "biased_gate_up"), ("Q4_K", 256, 2, "summed"),
                                               ("F16", 13, 1, "summed")])
def test_cluster_scatter_keeps_the_butterflys_bits(device, name, k, n_tok, kind):
    """mv_sum_scatter on the experts' mat-vecs, whose rows' lanes lie within one subgroup: the
    pairs' outputs (plain, the fused gate/up with and without biases) and the summed down
    projection's stream and norm bit for bit as with the butterfly."""
    from vkrt.commands import run_once
    from vkrt.ops.mat_vec import mat_vec_variant
    from vkrt.ops.matmul import NormOutput
    from vkrt.ops.mul_mat_id import mul_mat_id_sum
    from vkrt.ops.quant import kernel_type
    prof = device.profile
    if not prof.subgroup_shuffle or (kind == "summed" and prof.subgroup_min != prof.subgroup_max):
        pytest.skip("needs shuffle clusters (and, summed, one fixed subgroup size for its norm)")
    base = dataclasses.replace(device.tuning, mv_id_wg=prof.subgroup_max, mv_rows=4, mv_fill_groups=1,
                               mv_rows_by_type=(), mv_rows_one_column_by_type=())
    m = 64 if kind == "summed" else 22
    on = dataclasses.replace(base, mv_sum_scatter=True)
    defines = mat_vec_variant(device, kernel_type(name), 1, on, k=k, m=m, xvec4=False, entry="mul_mv_id",
                              gate_up="silu" if "gate_up" in kind else None)[0]
    assert "REDUCE_CLUSTER" in defines and defines["MV_SCATTER"] == defines["TPR"] > 1
    rng = np.random.default_rng(k + n_tok)
    two = 2 if "gate_up" in kind else 1
    both = weight_tensor(device, name, random_blocks(name, two * N_EXPERT * m, k, rng, scale=0.5),
                         (k, m, two * N_EXPERT))
    gate, up = (both.slice(2, 0, N_EXPERT), both.slice(2, N_EXPERT, 2 * N_EXPERT)) if two == 2 else (both, None)
    ids = tensor_from_numpy(device, routing(rng, n_tok))
    x = tensor_from_numpy(device, rng.standard_normal((n_tok, N_USED, k)).astype(np.float32))
    made = [both, ids, x]
    bias = [tensor_from_numpy(device, rng.standard_normal((N_EXPERT, m)).astype(np.float32)) for _ in range(2)]
    made += bias
    wt = tensor_from_numpy(device, rng.uniform(0, 1, (n_tok, N_USED)).astype(np.float32))
    resid = rng.standard_normal((n_tok, m)).astype(np.float32)
    nw = tensor_from_numpy(device, (1 + 0.1 * rng.standard_normal(m)).astype(np.float32))
    counter = tensor_from_numpy(device, np.zeros(1, np.int32))
    made += [wt, nw, counter]
    outs = []
    try:
        for tune in (base, on):
            if kind == "summed":
                s, c = tensor_from_numpy(device, resid), Tensor.empty(device, "F32", (m, n_tok))
                made += [s, c]
                done = []
                run_once(device, lambda seq: done.append(mul_mat_id_sum(
                    seq, gate, x, ids, wt, s, NormOutput(nw, 1e-6, c, counter), tuning=tune)))
                assert done == [True]
                outs.append([read_tensor(t) for t in (s, c)])
                continue
            y = Tensor.empty(device, "F32", (m, N_USED, n_tok))
            made.append(y)
            kw = {}
            if "gate_up" in kind:
                kw = dict(up_weight=up, act="swiglu_oai" if kind == "biased_gate_up" else "silu")
            if kind == "biased_gate_up":
                kw |= dict(bias=bias[0], up_bias=bias[1])
            run_once(device, lambda seq: mul_mat_id(seq, gate, x, ids, y, tuning=tune, **kw))
            outs.append([read_tensor(y)])
        for a, b in zip(*outs):
            assert np.isfinite(a).all() and np.abs(a).max() > 0
            np.testing.assert_array_equal(b.view(np.uint32), a.view(np.uint32))
    finally:
        for t in made:
            t.close()
