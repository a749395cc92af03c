"""MoE routing (softmax + top-k + renormalisation) and the weighted expert combination."""

import dataclasses

import numpy as np
import pytest

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.memory import Tensor



@pytest.mark.parametrize("n_expert, n_used, n_tokens, ties", [(8, 2, 5, False), (128, 8, 3, False),
                                                               (60, 4, 7, False), (256, 16, 2, False),
                                                               (512, 8, 2, False), (128, 8, 4, True)])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("subgroups", [False, True, "one"])
def test_route(device, n_expert, n_used, n_tokens, ties, normalize, subgroups):
    """Against numpy; `ties`: logits from a few values, so equal ones go to the lower expert id
    (subgroup max/min and the shared-memory tree alike). "one": a workgroup of one subgroup
    (no shared memory; the NVIDIA and GCN layout), at most 32 experts a lane."""
    from vkrt.ops.moe import ROUTER_EPT, moe_route
    prof = device.profile
    if subgroups and not prof.subgroup_arithmetic:
        pytest.skip("no subgroup arithmetic on this device")
    one = subgroups == "one"
    if one and (prof.subgroup_min != prof.subgroup_max or n_expert > ROUTER_EPT * prof.subgroup_min):
        pytest.skip(f"{n_expert} experts do not fit one subgroup of {prof.subgroup_min}-{prof.subgroup_max} lanes")
    rng = np.random.default_rng(n_expert + n_used)
    logits = (rng.standard_normal((n_tokens, n_expert)) * 2).astype(np.float32)
    if ties:
        logits = np.round(logits)
    tl = tensor_from_numpy(device, logits)
    ids = Tensor.empty(device, "I32", (n_used, n_tokens))
    w = Tensor.empty(device, "F32", (n_used, n_tokens))
    try:
        run_once(device, lambda s: moe_route(s, tl, ids, w, n_used, normalize, subgroups=bool(subgroups),
                                                   one_subgroup=one))
        x = logits.astype(np.float64)
        p = np.exp(x - x.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        ref_ids = np.argsort(-logits, axis=-1, kind="stable")[:, :n_used]
        ref_w = np.take_along_axis(p, ref_ids, -1)
        if normalize:
            ref_w /= ref_w.sum(-1, keepdims=True)
        np.testing.assert_array_equal(read_tensor(ids), ref_ids)
        np.testing.assert_allclose(read_tensor(w), ref_w, rtol=1e-5, atol=1e-7)
    finally:
        for t in (tl, ids, w):
            t.close()


def expert_order_sum(w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """sum_j w[:, j] * y[:, j] in float32, expert by expert, each product rounded (no fused
    multiply-add): moe_sum.glsl's order."""
    acc = np.zeros(y[:, 0].shape, np.float32)
    for j in range(y.shape[1]):
        acc = acc + w[:, j, None] * y[:, j]
    return acc


@pytest.mark.parametrize("with_shared, k", [(False, 1), (False, 4), (False, 10), (True, 4), (True, 10)])
def test_combine(device, with_shared, k):
    """The experts' weighted sum (and the gated shared expert): against numpy, and without the
    shared expert bit for bit against the expert-order float32 sum; 1 to 10 experts (past one
    chunk of moe_sum.glsl's loads)."""
    from vkrt.ops.moe import moe_combine
    rng = np.random.default_rng(4)
    E, T = 33, 6
    y = rng.standard_normal((T, k, E)).astype(np.float32)
    w = rng.random((T, k)).astype(np.float32)
    s = rng.standard_normal((T, E)).astype(np.float32)
    g = rng.standard_normal(T).astype(np.float32)
    ty, tw, ts, tg = (tensor_from_numpy(device, a) for a in (y, w, s, g))
    out = Tensor.empty(device, "F32", (E, T))
    try:
        run_once(device, lambda q: moe_combine(q, ty, tw, out, ts if with_shared else None, tg if with_shared else None))
        ref = (w[:, :, None].astype(np.float64) * y).sum(1)
        if with_shared:
            ref += s / (1 + np.exp(-g.astype(np.float64)))[:, None]
        np.testing.assert_allclose(read_tensor(out), ref, rtol=1e-5, atol=1e-5)
        if not with_shared:
            np.testing.assert_array_equal(read_tensor(out).view(np.uint32), expert_order_sum(w, y).view(np.uint32))
    finally:
        for t in (ty, tw, ts, tg, out):
            t.close()


@pytest.mark.parametrize("with_shared, first, k", [(False, 0, 4), (True, 0, 4), (True, 4, 4), (False, 0, 10)])
def test_combine_inside_the_norm(device, with_shared, first, k):
    """rms_norm with an ExpertSum as its residual adds the experts' weighted sum (and the gated
    shared expert) bit for bit as moe_combine then the add+norm kernel do; over tokens first.. too
    (the output norm's last token). Against numpy as well."""
    from vkrt.ops.moe import ExpertSum
    from vkrt.ops.norm import rms_norm
    rng = np.random.default_rng(7)
    E, T = 96, 6
    y = rng.standard_normal((T, k, E)).astype(np.float32)
    w = rng.random((T, k)).astype(np.float32)
    s = rng.standard_normal((T, E)).astype(np.float32)
    g = rng.standard_normal((T, 1)).astype(np.float32)   # [1, T], as the model's gate logits
    x = rng.standard_normal((T, E)).astype(np.float32)
    gamma = rng.standard_normal(E).astype(np.float32)
    ty, tw, ts, tg, tgamma = (tensor_from_numpy(device, a) for a in (y, w, s, g, gamma))
    tx1, tx2 = tensor_from_numpy(device, x), tensor_from_numpy(device, x)
    combined, out1, out2 = (Tensor.empty(device, "F32", (E, T)) for _ in range(3))
    sh, sg = (ts, tg) if with_shared else (None, None)
    total = ExpertSum(ty, tw, combined, sh, sg).slice(1, first, T)
    cols = (lambda t: t.slice(1, first, T))
    try:
        run_once(device, lambda q: rms_norm(q, cols(tx1), cols(out1), 1e-6, tgamma, residual=total))
        run_once(device, lambda q: rms_norm(q, cols(tx2), cols(out2), 1e-6, tgamma, residual=total.store(q)))
        for a, b in ((tx1, tx2), (out1, out2)):
            np.testing.assert_array_equal(read_tensor(a).view(np.uint32), read_tensor(b).view(np.uint32))
        ref = (w[:, :, None].astype(np.float64) * y).sum(1) + x
        if with_shared:
            ref += s / (1 + np.exp(-g.astype(np.float64)))
        np.testing.assert_allclose(read_tensor(tx1)[first:], ref[first:], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(read_tensor(tx1)[:first], x[:first])
        normed = ref / np.sqrt((ref ** 2).mean(-1, keepdims=True) + 1e-6) * gamma
        np.testing.assert_allclose(read_tensor(out1)[first:], normed[first:], rtol=1e-4, atol=1e-4)
    finally:
        for t in (ty, tw, ts, tg, tgamma, tx1, tx2, combined, out1, out2):
            t.close()


@pytest.mark.parametrize("n_expert, n_used, n_tokens", [(32, 4, 5), (128, 4, 3)])
def test_route_softmax_of_the_chosen(device, n_expert, n_used, n_tokens):
    """gpt-oss's gating (llama.cpp's SOFTMAX_WEIGHT): the top-k by logit, weighted by the softmax
    of their logits alone; with the logits spread wide the weights differ from the full softmax's."""
    from vkrt.ops.moe import moe_route
    rng = np.random.default_rng(n_expert)
    logits = (rng.standard_normal((n_tokens, n_expert)) * 3).astype(np.float32)
    tl = tensor_from_numpy(device, logits)
    ids = Tensor.empty(device, "I32", (n_used, n_tokens))
    w = Tensor.empty(device, "F32", (n_used, n_tokens))
    try:
        run_once(device, lambda s: moe_route(s, tl, ids, w, n_used, False, chosen_softmax=True))
        ref_ids = np.argsort(-logits, axis=-1, kind="stable")[:, :n_used]
        chosen = np.take_along_axis(logits, ref_ids, -1).astype(np.float64)
        ref_w = np.exp(chosen - chosen.max(-1, keepdims=True))
        ref_w /= ref_w.sum(-1, keepdims=True)
        np.testing.assert_array_equal(read_tensor(ids), ref_ids)
        np.testing.assert_allclose(read_tensor(w), ref_w, rtol=1e-5, atol=1e-7)
        full = np.exp(logits - logits.max(-1, keepdims=True))
        assert np.abs(np.take_along_axis(full / full.sum(-1, keepdims=True), ref_ids, -1) - ref_w).max() > 0.05
    finally:
        for t in (tl, ids, w):
            t.close()


@pytest.mark.parametrize("n_expert, n_used, n_tokens", [(16, 4, 5), (128, 8, 3), (160, 8, 2)])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("subgroups", [False, True])
def test_route_sigmoid_with_selection_bias(device, n_expert, n_used, n_tokens, normalize, subgroups):
    """glm4moe's gating (llama.cpp's SIGMOID with exp_probs_b): the top-k by sigmoid(logit) +
    bias, weighted by sigmoid(logit) alone (renormalised with `normalize`); the bias changes
    which experts win, so ids by the bias-free order would differ."""
    from vkrt.ops.moe import moe_route
    if subgroups and not device.profile.subgroup_arithmetic:
        pytest.skip("no subgroup arithmetic on this device")
    rng = np.random.default_rng(n_expert + 7)
    logits = (rng.standard_normal((n_tokens, n_expert)) * 2).astype(np.float32)
    bias = (rng.standard_normal(n_expert) * 0.5).astype(np.float32)
    tl, tb = tensor_from_numpy(device, logits), tensor_from_numpy(device, bias)
    ids = Tensor.empty(device, "I32", (n_used, n_tokens))
    w = Tensor.empty(device, "F32", (n_used, n_tokens))
    try:
        run_once(device, lambda s: moe_route(s, tl, ids, w, n_used, normalize, sigmoid_bias=tb,
                                             subgroups=subgroups))
        p = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
        ref_ids = np.argsort(-(p + bias), axis=-1, kind="stable")[:, :n_used]
        ref_w = np.take_along_axis(p, ref_ids, -1)
        if normalize:
            ref_w /= ref_w.sum(-1, keepdims=True)
        np.testing.assert_array_equal(read_tensor(ids), ref_ids)
        np.testing.assert_allclose(read_tensor(w), ref_w, rtol=1e-5, atol=1e-7)
        assert (np.sort(np.argsort(-p, axis=-1, kind="stable")[:, :n_used]) != np.sort(ref_ids)).any()
    finally:
        for t in (tl, tb, ids, w):
            t.close()


def routes_in_one_subgroup(device, one: bool) -> bool:
    """Whether the router's epilogue routes in one subgroup (ROUTE_SUBGROUP): the one-subgroup
    router's, and the other's where its workgroup (ROUTER_WG) is one subgroup (64 lanes)."""
    from vkrt.ops.moe import ROUTER_WG
    prof = device.profile
    return bool(prof.subgroup_arithmetic and (one or ROUTER_WG == prof.subgroup_min))


@pytest.mark.parametrize("n_expert, n_used, n_tokens, gating", [(128, 8, 1, "norm"), (60, 4, 3, "softmax"),
                                                                 (32, 4, 2, "chosen"), (128, 8, 1, "sigmoid"),
                                                                 (256, 8, 2, "norm"), (64, 4, 7, "norm")])
@pytest.mark.parametrize("mv_wg", [64, 128, 256])
@pytest.mark.parametrize("one", [False, True])
def test_route_in_the_router_mat_vec(device, monkeypatch, n_expert, n_used, n_tokens, gating, mv_wg, one):
    """The router's mat-vec routing its tokens in its last workgroup (mul_mv ROUTE) against the
    mat-vec then moe_route: the same logits, ids and weights, bit for bit, with mat-vec workgroups
    as wide as the router's or wider; replayed, the counter is back at 0 and it routes again.
    one=True: a one-subgroup router, whose epilogue routes in the last workgroup's subgroups, a
    token each at a time; one=False: the router of several subgroups, routed by the whole last
    workgroup (each asked for explicitly: the default depends on the device's subgroup size)."""
    route_in_the_router_mat_vec(device, monkeypatch, n_expert, n_used, n_tokens, gating, mv_wg, one)


@pytest.mark.parametrize("n_tokens, one", [(7, False), (11, True), (16, False)])
def test_route_in_the_router_mat_vec_in_runs(device, monkeypatch, n_tokens, one):
    """More tokens than a mat-vec run (runs of 4 columns): each run routes its own tokens in its
    last workgroup, counted on a counter of its own, bit for bit as the mat-vec then moe_route;
    with fewer counters than runs, or more tokens than a mat-vec takes, there is no epilogue."""
    from vkrt.ops.moe import ROUTE_COUNTERS, route_epilogue
    route_in_the_router_mat_vec(device, monkeypatch, 64, 4, n_tokens, "norm", 64, one, run_columns=4,
                                counters=ROUTE_COUNTERS)
    counter = tensor_from_numpy(device, np.zeros(1, np.int32))
    tw = Tensor.empty(device, "F32", (96, 64))
    made = [counter, tw]
    try:
        for n, counters in ((n_tokens, counter), (17, None)):
            logits, ids, wts = (Tensor.empty(device, t, (r, n)) for t, r in (("F32", 64), ("I32", 4), ("F32", 4)))
            made += [logits, ids, wts]
            if counters is None:
                counters = tensor_from_numpy(device, np.zeros(ROUTE_COUNTERS, np.int32))
                made.append(counters)
            assert route_epilogue(device, tw, logits, ids, wts, 4, True, counters) is None
    finally:
        for t in made:
            t.close()


@pytest.mark.parametrize("n_tokens", [3, 7])
def test_route_in_the_router_mat_vec_wraps_its_subgroups(device, monkeypatch, n_tokens):
    """More tokens than the last workgroup's subgroups (mv_wg 16: two of lavapipe's 8 lanes):
    each routes every other token, bit for bit as moe_route."""
    route_in_the_router_mat_vec(device, monkeypatch, 64, 4, n_tokens, "norm", 16, True)


@pytest.mark.parametrize("n_tokens", [1, 4])
def test_route_in_the_router_mat_vec_summed_by_a_reduce_scatter(device, monkeypatch, n_tokens):
    """mv_sum_scatter where the router's row is whole subgroups (its workgroup, 64 lanes): the
    routing mat-vec sums as the plain mat-vec does, so logits, ids and weights stay bit for bit."""
    from vkrt.ops.mat_vec import mat_vec_variant
    from vkrt.ops.quant import kernel_type
    prof = device.profile
    tune = dataclasses.replace(device.tuning, mv_wg=64, mv_sum_scatter=True)
    defines = mat_vec_variant(device, kernel_type("F32"), n_tokens, tune, k=256, m=64, xvec4=True)[0]
    if "MV_SCATTER" not in defines or "REDUCE_SUBGROUP" not in defines:
        pytest.skip(f"64 lanes of {prof.subgroup_min}-{prof.subgroup_max}-lane subgroups: no subgroup reduce-scatter")
    route_in_the_router_mat_vec(device, monkeypatch, 64, 4, n_tokens, "norm", 64, False, scatter=True, K=256)


def route_in_the_router_mat_vec(device, monkeypatch, n_expert, n_used, n_tokens, gating, mv_wg, one, scatter=False,
                                K=96, run_columns=None, counters=1):
    from vkrt.commands import CommandSequence
    from vkrt.ops.matmul import matmul
    from vkrt.ops.moe import moe_route, route_epilogue
    tune = dataclasses.replace(device.tuning, mv_wg=mv_wg, mv_sum_scatter=scatter)
    if run_columns:
        tune = dataclasses.replace(tune, mv_max_n=8, mv_dense_max_n=run_columns, mv_chunk_n=16)
    monkeypatch.setattr(device, "tuning", tune)
    rng = np.random.default_rng(n_expert + n_tokens)
    w = (rng.standard_normal((n_expert, K)) * 0.5).astype(np.float32)
    x = rng.standard_normal((n_tokens, K)).astype(np.float32)
    bias = rng.standard_normal(n_expert).astype(np.float32) * 0.1
    tw, tx, tb = (tensor_from_numpy(device, a) for a in (w, x, bias))
    counter = tensor_from_numpy(device, np.zeros(counters, np.int32))
    made = [tw, tx, tb, counter]
    outs = []
    kw = dict(chosen_softmax=gating == "chosen", sigmoid_bias=tb if gating == "sigmoid" else None, one_subgroup=one)
    normalize = gating in ("norm", "sigmoid")
    try:
        for fused in (False, True):
            logits = Tensor.empty(device, "F32", (n_expert, n_tokens))
            ids = Tensor.empty(device, "I32", (n_used, n_tokens))
            wts = Tensor.empty(device, "F32", (n_used, n_tokens))
            made += [logits, ids, wts]
            with CommandSequence(device) as seq:
                with seq.record():
                    if fused:
                        route = route_epilogue(device, tw, logits, ids, wts, n_used, normalize, counter, **kw)
                        assert route is not None
                        assert ("ROUTE_SUBGROUP" in route.defines) == routes_in_one_subgroup(device, one)
                        matmul(seq, tw, tx, logits, route=route)
                    else:
                        matmul(seq, tw, tx, logits)
                        moe_route(seq, logits, ids, wts, n_used, normalize, **kw)
                seq.run()
                first = read_tensor(ids).copy()
                run_once(device, lambda q: q.fill(ids.range(), 0xFFFFFFFF))
                seq.run()   # replayed: routes again
            np.testing.assert_array_equal(read_tensor(ids), first)
            outs.append([read_tensor(t).view(np.uint32) for t in (logits, ids, wts)])
        assert not read_tensor(counter).any()
        for a, b in zip(*outs):
            np.testing.assert_array_equal(a, b)
        score = x.astype(np.float64) @ w.T.astype(np.float64)
        if gating == "sigmoid":
            score = 1 / (1 + np.exp(-score)) + bias
        ref = np.argsort(-score, axis=-1, kind="stable")[:, :n_used]
        assert (outs[1][1].view(np.int32) == ref).mean() > 0.9   # float rounding may swap near-ties
    finally:
        for t in made:
            t.close()


@pytest.mark.parametrize("K, n_tokens, mv_wg, reduce_wg, held", [(96, 1, 64, 64, 32), (96, 2, 64, 256, 32),
                                                                (520, 1, 64, 256, 32), (520, 2, 64, 64, 32),
                                                                (520, 1, 128, 512, 32), (2048, 1, 64, 256, 32),
                                                                (2048, 1, 128, 512, 32), (2048, 2, 128, 1024, 32),
                                                                (1280, 4, 128, 1024, 64)])
@pytest.mark.parametrize("one", [False, True])
def test_norm_in_the_router_mat_vec(device, monkeypatch, K, n_tokens, mv_wg, reduce_wg, held, one):
    """The residual add and RMS norm in the router mat-vec's prologue (mul_mv NORM_IN) against
    rms_norm (residual, sum_out=x) then the routing mat-vec: x + r, the normed x, the logits, ids
    and weights bit for bit, with mat-vec subgroups each redoing one or several of the norm
    workgroup's subgroups, one or several elements a lane (rows not a multiple of the norm's
    workgroup), one, two and four tokens (four: a lane holding past the default
    mv_norm_max_held), routed by the last workgroup (one=False) or its first subgroup
    (one=True); the normed x also against numpy."""
    import dataclasses

    from vkrt.commands import CommandSequence
    from vkrt.ops.matmul import matmul, norm_input
    from vkrt.ops.moe import route_epilogue
    from vkrt.ops.norm import rms_norm
    prof = device.profile
    if not prof.subgroup_shuffle or prof.subgroup_min != prof.subgroup_max or mv_wg < prof.subgroup_min:
        pytest.skip("the norm prologue needs shuffles and one fixed subgroup size no wider than the mat-vec")
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, mv_wg=mv_wg, reduce_wg=reduce_wg,
                                                              mv_norm_max_held=held, mv_dense_max_n=8))
    rng = np.random.default_rng(K + n_tokens)
    n_expert, n_used = 64, 4
    w = (rng.standard_normal((n_expert, K)) * 0.5).astype(np.float32)
    x0 = (rng.standard_normal((n_tokens, K)) * 3).astype(np.float32)
    r = rng.standard_normal((n_tokens, K)).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)
    tw, tr, tnw = (tensor_from_numpy(device, a) for a in (w, r, nw))
    counter = tensor_from_numpy(device, np.zeros(1, np.int32))
    made = [tw, tr, tnw, counter]
    outs = []
    try:
        for fused in (False, True):
            tx = tensor_from_numpy(device, x0)
            cur = Tensor.empty(device, "F32", (K, n_tokens))
            logits = Tensor.empty(device, "F32", (n_expert, n_tokens))
            ids = Tensor.empty(device, "I32", (n_used, n_tokens))
            wts = Tensor.empty(device, "F32", (n_used, n_tokens))
            made += [tx, cur, logits, ids, wts]
            with CommandSequence(device) as seq:
                with seq.record():
                    route = route_epilogue(device, tw, logits, ids, wts, n_used, True, counter, one_subgroup=one)
                    assert route is not None
                    assert ("ROUTE_SUBGROUP" in route.defines) == routes_in_one_subgroup(device, one)
                    if fused:
                        norm_in = norm_input(device, tx, tr, tnw, 1e-5, cur)
                        assert norm_in is not None
                        matmul(seq, tw, cur, logits, route=route, norm_in=norm_in)
                    else:
                        rms_norm(seq, tx, cur, 1e-5, tnw, residual=tr, sum_out=tx)
                        matmul(seq, tw, cur, logits, route=route)
                seq.run()
            outs.append([read_tensor(t).view(np.uint32).copy() for t in (tx, cur, logits, ids, wts)])
        assert read_tensor(counter)[0] == 0
        for a, b in zip(*outs):
            np.testing.assert_array_equal(a, b)
        s = x0.astype(np.float64) + r
        ref = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-5) * nw
        np.testing.assert_allclose(outs[1][1].view(np.float32).reshape(n_tokens, K), ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(outs[1][0].view(np.float32).reshape(n_tokens, K), x0 + r)
    finally:
        for t in made:
            t.close()


def test_norm_in_the_router_mat_vec_falls_back(device, monkeypatch):
    """norm_input gives None (the norm stays a dispatch of its own) where the mat-vec cannot
    repeat rms_norm's sums: rows not a multiple of 4, a norm weight of another length, x and the
    residual laid out differently, more columns than one run, the normed x over shared memory."""
    import dataclasses

    from vkrt.commands import CommandSequence
    from vkrt.ops.mat_vec import mat_vec_columns
    from vkrt.ops.matmul import norm_input
    prof = device.profile
    if not prof.subgroup_shuffle or prof.subgroup_min != prof.subgroup_max:
        pytest.skip("the norm prologue needs shuffles and one fixed subgroup size")

    def made(shape, nb=None):
        t = Tensor.empty(device, "F32", shape)
        own.append(t)
        return t if nb is None else t.view(shape, nb=nb)

    own = []
    try:
        with CommandSequence(device) as seq, seq.record():
            def ok(k, n=1, wk=None, residual=None):
                x, cur = made((k, n)), made((k, n))
                return norm_input(device, x, residual if residual is not None else made((k, n)),
                                  made((wk or k,)), 1e-6, cur) is not None
            assert ok(256)
            assert not ok(98)
            assert not ok(256, wk=128)
            assert not ok(256, n=2, residual=made((256, 2), nb=(4, 2048, 4096, 4096)))
            assert not ok(256, n=mat_vec_columns(device.tuning) + 1)
            # a lane of the router's mat-vec would hold 64 values of x + r: past mv_norm_max_held
            monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, mv_wg=128, reduce_wg=1024,
                                                                      mv_dense_max_n=8))
            assert 4 * (1024 // prof.subgroup_min) // (128 // prof.subgroup_min) * 2 == 64   # n x per x e
            assert not ok(1280, n=4)
            monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, mv_norm_max_held=64))
            assert ok(1280, n=4)
            monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, mv_norm_max_held=32))
            monkeypatch.setattr(device, "profile", dataclasses.replace(prof, shared_memory=4096))
            assert not ok(256)
    finally:
        for t in own:
            t.close()
