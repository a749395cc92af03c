"""A DeltaNet catch-up's device-read span: the conv windows (ops/gdn_catch_up.py) against numpy,
and the delta rule over a span (delta_net(span=True)) bit for bit against the rule over those
columns alone, with one recording run for several spans."""

import numpy as np
import pytest

from test_delta_net import EPS, make_case
from vkrt.commands import CommandSequence, read_tensor, run_once, tensor_from_numpy, write_tensor
from vkrt.errors import GGMLTypeError, OutOfRange
from vkrt.memory import F32, I32, MemoryKind, Tensor


def windows_reference(snap, kept, first, count):
    """snap [L, taps, C], kept [L, columns, C] -> the windows [L, taps, C]."""
    taps = snap.shape[1]
    out = np.empty_like(snap)
    for j in range(taps):
        w = count + j
        out[:, j] = snap[:, w] if w < taps else kept[:, first + w - taps]
    return out


def test_windows_for_every_span_from_one_recording(device):
    """Layers with padded strides in all three tensors; spans shorter than, equal to and longer
    than the taps, at several first columns, all from one recorded sequence whose span buffer
    the host rewrites; nothing outside the windows changes."""
    from vkrt.ops.gdn_catch_up import catch_up_windows
    rng = np.random.default_rng(3)
    C, taps, L, cols = 24, 3, 4, 9
    snap_block = rng.standard_normal((L, taps + 2, C + 4)).astype(np.float32)    # padded layer and tap strides
    kept_block = rng.standard_normal((L, cols + 1, C + 8)).astype(np.float32)
    out_block = np.full((L, taps + 1, C + 4), 5.0, np.float32)
    tensors = [tensor_from_numpy(device, a) for a in (snap_block, kept_block, out_block)]
    span = Tensor.empty(device, I32, (6,), kind=MemoryKind.HOST)
    t_snap, t_kept, t_out = tensors
    seq = CommandSequence(device, label="windows")
    try:
        snap = t_snap.view((C, taps, L), nb=(4, 4 * (C + 4), 4 * (taps + 2) * (C + 4)), offset=8)
        kept = t_kept.view((C, cols, L), nb=(4, 4 * (C + 8), 4 * (cols + 1) * (C + 8)), offset=4 * (C + 8))
        out = t_out.view((C, taps, L), nb=(4, 4 * (C + 4), 4 * (taps + 1) * (C + 4)), offset=4 * (C + 4))
        with seq.record():
            catch_up_windows(seq, out, snap, kept, span.view((3,), offset=12))
        for first, count in ((0, 1), (2, 2), (0, 3), (4, 5), (0, 9), (6, 3)):
            span.range().write(np.array([1, first, count], np.int32), 12)
            seq.run()
            got = read_tensor(t_out)
            want = windows_reference(snap_block[:, :taps, 2:2 + C], kept_block[:, 1:, :C], first, count)
            np.testing.assert_array_equal(got[:, 1:, :C], want, err_msg=f"span ({first}, {count})")
            outside = np.ones(got.shape, bool)
            outside[:, 1:, :C] = False
            assert (got[outside] == 5.0).all()
    finally:
        seq.close()
        for t in tensors + [span]:
            t.close()


def test_window_errors(device):
    from vkrt.ops.gdn_catch_up import catch_up_windows
    made = []

    def t(typ, *ne):
        made.append(Tensor.empty(device, typ, ne))
        return made[-1]
    try:
        out, snap, kept, span = t(F32, 8, 3, 2), t(F32, 8, 3, 2), t(F32, 8, 5, 2), t(I32, 3)

        def call(**kw):
            args = {**dict(out=out, snapshot=snap, kept=kept, span=span), **kw}
            run_once(device, lambda seq: catch_up_windows(seq, **args))
        call()
        with pytest.raises(OutOfRange, match="out and snapshot must both be"):
            call(snapshot=t(F32, 8, 2, 2))
        with pytest.raises(OutOfRange, match=r"kept must be \[8, columns, 2\]"):
            call(kept=t(F32, 8, 5, 3))
        with pytest.raises(GGMLTypeError, match="span must be a contiguous I32 tensor of 3"):
            call(span=t(I32, 2))
        with pytest.raises(OutOfRange, match="overlaps kept"):
            call(kept=out.view((8, 3, 2)))
    finally:
        for x in made:
            x.close()


@pytest.mark.parametrize("from_snapshot", [False, True])
@pytest.mark.parametrize("lanes_case", [dict(n_k_heads=2, n_v_heads=4, head_dim=16), dict(n_k_heads=1, n_v_heads=2,
                                                                                        head_dim=32)])
def test_rule_over_a_span_equals_the_rule_over_those_columns(device, lanes_case, from_snapshot):
    """delta_net(span=True) recorded once over 10 columns, run for spans (first, count) the host
    writes: the state and the span's outputs are bit for bit those of delta_net over just those
    columns; the outputs outside the span stay as they were. from_snapshot: the state starts from
    state_in (a snapshot, left as it was), not the slot's own."""
    from vkrt.ops.delta_net import delta_net
    c = make_case(8, **lanes_case, n_tokens=10, n_slots=3)
    d, hv = c.head_dim, c.n_v_heads
    shape = dict(n_k_heads=c.n_k_heads, n_v_heads=hv, head_dim=d, n_seqs=1, eps=EPS)
    ins = [tensor_from_numpy(device, a) for a in (c.qkv, c.alpha, c.beta, c.dt_bias, c.ssm_a)]
    span = Tensor.empty(device, I32, (3,), kind=MemoryKind.HOST)
    state = tensor_from_numpy(device, c.state)
    out = tensor_from_numpy(device, np.full((10, hv * d), 9.0, np.float32))
    snap_values = (0.3 * np.random.default_rng(1).standard_normal(c.state.shape[1:])).astype(np.float32)
    snap = tensor_from_numpy(device, snap_values)
    seq = CommandSequence(device, label="span rule")
    made = ins + [span, state, out, snap]
    try:
        with seq.record():
            delta_net(seq, *ins, state, span, out, **shape, span=True, state_in=snap if from_snapshot else None)
        for first, count in ((0, 1), (3, 4), (0, 10), (9, 1)):
            write_tensor(out, np.full((10, hv * d), 9.0, np.float32))
            state_before = read_tensor(state)
            span.range().write(np.array([2, first, count], np.int32))
            seq.run()
            got_state, got_out = read_tensor(state), read_tensor(out)
            # the same columns as a step of their own
            cols = [tensor_from_numpy(device, a[first:first + count]) for a in (c.qkv, c.alpha, c.beta)]
            start = state_before.copy()
            if from_snapshot:
                start[2] = snap_values
                np.testing.assert_array_equal(read_tensor(snap), snap_values)
            alone_state = tensor_from_numpy(device, start)
            alone_out = tensor_from_numpy(device, np.zeros((count, hv * d), np.float32))
            slot = tensor_from_numpy(device, np.array([2], np.int32))
            made += cols + [alone_state, alone_out, slot]
            run_once(device, lambda s: delta_net(s, *cols, *ins[3:], alone_state, slot, alone_out, **shape,
                                                 chunked=False))
            np.testing.assert_array_equal(got_state, read_tensor(alone_state), err_msg=f"state ({first}, {count})")
            np.testing.assert_array_equal(got_out[first:first + count], read_tensor(alone_out))
            assert (np.delete(got_out, np.s_[first:first + count], 0) == 9.0).all()
            assert (got_state[[0, 1]] == state_before[[0, 1]]).all() and (got_state[2] != state_before[2]).any()
    finally:
        seq.close()
        for t in made:
            t.close()


def test_a_span_is_one_sequence_in_the_recurrent_form(device):
    from vkrt.ops.delta_net import delta_net
    c = make_case(2, n_k_heads=1, n_v_heads=2, head_dim=16, n_tokens=4, n_seqs=2)
    ts = [tensor_from_numpy(device, a) for a in (c.qkv, c.alpha, c.beta, c.dt_bias, c.ssm_a, c.state,
                                                 np.array([0, 0, 2], np.int32), np.zeros((4, 32), np.float32))]
    shape = dict(n_k_heads=1, n_v_heads=2, head_dim=16, eps=EPS)
    try:
        with pytest.raises(OutOfRange, match="a span is one sequence in the recurrent form"):
            run_once(device, lambda seq: delta_net(seq, *ts, **shape, n_seqs=2, span=True))
        with pytest.raises(OutOfRange, match="a span is one sequence in the recurrent form"):
            run_once(device, lambda seq: delta_net(seq, *ts, **shape, n_seqs=1, span=True, chunked=True))
        with pytest.raises(OutOfRange, match="state_in .* must go with a span"):
            run_once(device, lambda seq: delta_net(seq, *ts[:6], ts[6].view((2,)), ts[7], **shape, n_seqs=2,
                                                   state_in=ts[5].view((16, 16, 2))))
        with pytest.raises(OutOfRange, match="lie apart from it"):
            run_once(device, lambda seq: delta_net(seq, *ts, **shape, n_seqs=1, span=True,
                                                   state_in=ts[5].view((16, 16, 2))))
        with pytest.raises(GGMLTypeError, match="slots must be a contiguous I32 tensor of 3"):
            run_once(device, lambda seq: delta_net(seq, *ts[:6], ts[6].view((2,)), ts[7], **shape, n_seqs=1, span=True))
    finally:
        for t in ts:
            t.close()
