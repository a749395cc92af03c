"""The RX 580's 64-lane subgroup paths, run on this device: subgroups of 64 emulated on the
device's narrower ones (shaders/subgroup.glsl, SG_LOGICAL) under the AMD_GCN tuning table
(tests/conftest.py wave64), so each layout the RX 580 gets is laid out, compiled and executed
as there, its butterflies adding in the 64-lane order:
  - the emulation itself: butterfly, adds, max/min, ids against numpy (the butterfly bit for bit);
  - mat_vec_reduce "cluster" with 16-64 lanes a row (a butterfly across the whole wave) and
    "subgroup" over two waves (RED_SG 2, a row's sums in two parts): matmul against numpy;
  - mul_mat_id's 64-lane experts' mat-vec (mv_id_wg 64), with gate/up and bias;
  - slots_at_once and the summed expert down projection with a wave a slot (whole = 1) and 8
    groups a wave (whole = 8), its norm's 64-lane butterflies (norm_layout NORM_SG 64): bit for
    bit against mul_mat_id, moe_combine and rms_norm (reduce.glsl's 64-lane butterfly);
  - router_layout's one-subgroup router (64 lanes) alone and as the router mat-vec's epilogue
    (ROUTE_SUBGROUP; with emulated subgroups only where the workgroup is that subgroup), the
    whole-workgroup epilogue over two waves, and the router's norm prologue with NORM_SG 64
    (butterfly_subgroups, norm_wg at reduce_wg 1024): bit for bit against the kernels apart;
  - the delta rule's recurrent form with a row's 16 or 32 lanes (recurrent_layout at head sizes
    128 and 256) summing by shuffles across them: against the loop;
  - flash attention's norm_rope prologue with its norm in 64-lane subgroups: bit for bit against
    norm_rope then the attention."""

import numpy as np
import pytest
from test_matmul import check as check_matmul
from test_moe import test_norm_in_the_router_mat_vec as norm_in_router_bits
from test_moe import test_route_in_the_router_mat_vec as route_in_router_bits
from test_mul_mat_id import check as check_mul_mat_id
from test_mul_mat_id import test_bias_is_add_id as bias_bits
from test_mul_mat_id import test_fused_gate_up_is_bit_identical as gate_up_bits
from test_mul_mat_id import test_summed_down_normalises_the_stream_it_added_into as summed_down_bits

from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.memory import Tensor, ggml_type
from vkrt.ops.mat_vec import mat_vec_kernel, mat_vec_reduce, mat_vec_shape
from vkrt.ops.moe import moe_route, router_layout
from vkrt.ops.reduce import subgroup_defines
from vkrt.pipeline import Kernel

EMULATION_TEST = """#version 450
#include "common.glsl"
layout(local_size_x = WG) in;
layout(binding = 0) readonly buffer V { float v[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(binding = 2) writeonly buffer I { uint oi[]; };
#include "butterfly.glsl"
void main() {
    const uint i = sg_flat();
    const float x = v[i];
    o[i] = subgroup_butterfly(x);
    o[WG + i] = sg_add(x);
    o[2u * WG + i] = sg_max(x);
    oi[i] = sg_min(uint(i * 7u % 61u));
    oi[WG + i] = sg_id() * 1000u + sg_lane();
    oi[2u * WG + i] = sg_elect() ? sg_count() : 0u;
}
"""


def test_emulated_subgroups(wave64):
    """Two subgroups of 64 emulated: the butterfly's bits are a 64-lane device's (numpy adds in
    its order), adds, max and min over each subgroup, ids, lanes, elect and count."""
    assert subgroup_defines(wave64) == ({"SG_LOGICAL": 64} if wave64.profile.subgroup_size < 64 else {})
    wg = 128
    kern = Kernel(wave64, "subgroup_test", source=EMULATION_TEST, defines={"WG": wg, **subgroup_defines(wave64)})
    rng = np.random.default_rng(0)
    v = rng.standard_normal(wg).astype(np.float32) * np.float32(1e3) ** rng.integers(-1, 2, wg).astype(np.float32)
    tv = tensor_from_numpy(wave64, v)
    o, oi = Tensor.empty(wave64, "F32", (3 * wg,)), Tensor.empty(wave64, "I32", (3 * wg,))
    try:
        run_once(wave64, lambda seq: seq.dispatch(kern, [tv.range(), o.range(), oi.range()]))
        got, ids = read_tensor(o).reshape(3, wg), read_tensor(oi).view(np.uint32).reshape(3, wg)
    finally:
        for t in (kern, tv, o, oi):
            t.close()
    lane = np.arange(wg)
    b = v.copy()
    for step in (32, 16, 8, 4, 2, 1):
        b = b + b[lane ^ step]
    np.testing.assert_array_equal(got[0].view(np.uint32), b.view(np.uint32))
    per = v.reshape(2, 64)
    np.testing.assert_allclose(got[1].reshape(2, 64), np.repeat(per.sum(1, dtype=np.float64), 64).reshape(2, 64),
                               rtol=1e-5, atol=1e-2)
    assert (got[1].reshape(2, 64) == got[1].reshape(2, 64)[:, :1]).all()
    np.testing.assert_array_equal(got[2].reshape(2, 64), np.repeat(per.max(1), 64).reshape(2, 64))
    np.testing.assert_array_equal(ids[0].reshape(2, 64),
                                  np.repeat((lane * 7 % 61).reshape(2, 64).min(1), 64).reshape(2, 64))
    np.testing.assert_array_equal(ids[1], lane // 64 * 1000 + lane % 64)
    np.testing.assert_array_equal(ids[2], np.where(lane % 64 == 0, 2, 0))


@pytest.mark.parametrize("name, k, form, lanes", [("Q4_K", 2048, "cluster", 64), ("Q6_K", 512, "cluster", 16),
                                                  ("Q4_0", 4096, "subgroup", 128), ("F32", 1000, "subgroup", 128)])
def test_mat_vec(wave64, name, k, form, lanes):
    """The dense mat-vec (mv_wg 128): a row's lanes sum by a butterfly within a wave, or by
    subgroup adds over the workgroup's two waves; one column and a run of 4."""
    typ = ggml_type(name)
    wg, got_lanes, _ = mat_vec_shape(wave64, typ, 1, wave64.tuning, k=k, m=37)
    assert (wg, got_lanes, mat_vec_reduce(wave64.profile, got_lanes, wg)) == (128, lanes, form)
    defines = mat_vec_kernel(wave64, typ, 1, wave64.tuning, k=k, m=37, xvec4=k % 4 == 0).kernel.defines
    assert defines.get("RED_SG", 0) == (2 if form == "subgroup" else 0)
    check_matmul(wave64, name, 37, k, (1, 4))


@pytest.mark.parametrize("name, k", [("Q4_0", 768), ("Q4_K", 256)])
def test_experts(wave64, name, k):
    """mul_mat_id's mat-vec at mv_id_wg 64 (a butterfly across the wave, or 8 rows' groups a
    wave) against numpy, with gate and up in one pass and with each expert's bias bit for bit."""
    assert mat_vec_reduce(wave64.profile, 64 if k == 768 else 8, 64) == "cluster"
    check_mul_mat_id(wave64, name, 48, k, (1, 3))
    gate_up_bits(wave64, name, k, 2)
    bias_bits(wave64, name, k, 1)


@pytest.mark.parametrize("name, k, m, n_tok", [("Q4_0", 768, 2048, 2), ("Q4_K", 256, 256, 1)])
def test_summed_down(wave64, name, k, m, n_tok):
    """The summed expert down projection: a wave a slot (Q4_0, K = 768: 8 waves) or 8 slots'
    groups in one wave (Q4_K, K = 256), the stream's norm in 64-lane subgroups."""
    wg, lanes, _ = mat_vec_shape(wave64, ggml_type(name), 1, wave64.tuning, k=k, m=m, entry="mul_mv_id_sum", slots=8)
    assert (wg, lanes) == ((512, 64) if k == 768 else (64, 8))
    summed_down_bits(wave64, name, k, m, n_tok, 0, False)


def test_router(wave64):
    """router_layout gives the one-subgroup router of 64 lanes; it routes as numpy does."""
    assert router_layout(wave64) == (64, True)
    rng = np.random.default_rng(1)
    n_expert, n_used, n_tokens = 128, 8, 3
    logits = (rng.standard_normal((n_tokens, n_expert)) * 2).astype(np.float32)
    tl = tensor_from_numpy(wave64, logits)
    ids, w = Tensor.empty(wave64, "I32", (n_used, n_tokens)), Tensor.empty(wave64, "F32", (n_used, n_tokens))
    try:
        run_once(wave64, lambda s: moe_route(s, tl, ids, w, n_used, True))
        p = np.exp(logits - logits.max(-1, keepdims=True).astype(np.float64))
        ref_ids = np.argsort(-logits, axis=-1, kind="stable")[:, :n_used]
        ref_w = np.take_along_axis(p, ref_ids, -1)
        np.testing.assert_array_equal(read_tensor(ids), ref_ids)
        np.testing.assert_allclose(read_tensor(w), ref_w / ref_w.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    finally:
        for t in (tl, ids, w):
            t.close()


@pytest.mark.parametrize("mv_wg", [64, 128])
@pytest.mark.parametrize("one", [False, True])
def test_routing_epilogue(wave64, monkeypatch, one, mv_wg):
    """The router mat-vec's routing epilogue in the first wave of its last workgroup (ROUTE_SUBGROUP:
    at 64 lanes ROUTER_WG is one subgroup as well), a workgroup of one wave or two, bit for bit."""
    route_in_router_bits(wave64, monkeypatch, 128, 8, 2, "norm", mv_wg, one)


@pytest.mark.parametrize("n_tokens, mv_wg", [(1, 64), (2, 128)])
def test_norm_in_the_router(wave64, monkeypatch, n_tokens, mv_wg):
    """The router's add and norm prologue at reduce_wg 1024 (16 norm subgroups of 64, 16 or 8 a
    wave), bit for bit against rms_norm."""
    norm_in_router_bits(wave64, monkeypatch, 2048, n_tokens, mv_wg, 1024, 32, True)   # (held, one)


@pytest.mark.parametrize("head_dim, lanes", [(128, 16), (256, 32)])
def test_delta_rule_lanes(wave64, head_dim, lanes):
    """The delta rule's recurrent form with a row's lanes across 16 or 32 of a wave (the RX 580's
    layouts at head sizes 128, Qwen3.5's, and 256), its sums by shuffles across them (wider than
    this device's subgroups: emulated), against the loop."""
    from test_delta_net import assert_close, make_case, run_gdn

    from vkrt.ops.delta_net import recurrent_layout
    assert recurrent_layout(wave64.tuning, wave64.profile, head_dim).lanes == lanes
    c = make_case(head_dim, n_k_heads=1, n_v_heads=2, head_dim=head_dim, n_tokens=3, n_seqs=1, n_slots=1)
    want_o, want_s = c.reference()
    out, state, used = run_gdn(wave64, c, False)
    assert used is False
    assert_close(out, want_o)
    assert_close(state, want_s, what="state")


@pytest.mark.parametrize("hd, n_head", [(128, 4), (256, 16)])
def test_norm_rope_in_flash_attention(wave64, hd, n_head):
    """Flash attention's norm_rope prologue with its q/k norm in 64-lane subgroups (NR_SG, the
    profile's subgroup_min: norm_rope's sums as the RX 580 runs them), bit for bit against
    norm_rope then the attention; head 128 and Qwen3.5's 256 with 16 query heads a KV head."""
    from test_fa_norm_rope import same_bits

    from vkrt.ops.reduce import butterfly_subgroups
    assert wave64.profile.subgroup_min == 64 and butterfly_subgroups(wave64, hd) is not None
    same_bits(wave64, hd=hd, n_head=n_head, n_kv_head=1, split_k=2, norm=True)
