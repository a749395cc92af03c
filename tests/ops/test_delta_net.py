"""The gated delta rule, recurrent and chunked forms, against the float64 token-by-token loop."""

import dataclasses

import numpy as np
import pytest

from delta_net_reference import delta_net_chunked, delta_net_loop
from vkrt.commands import read_tensor, run_once, tensor_from_numpy
from vkrt.errors import ConfigError, GGMLTypeError, OutOfRange, UnsupportedShape

EPS = 1e-6
FORMS = [pytest.param(False, id="recurrent"), pytest.param(True, id="chunked")]


@dataclasses.dataclass
class Case:
    """Inputs in numpy order (see delta_net_reference) and the shape arguments of delta_net."""

    qkv: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    dt_bias: np.ndarray
    ssm_a: np.ndarray
    state: np.ndarray
    slots: np.ndarray
    n_k_heads: int
    n_v_heads: int
    head_dim: int

    @property
    def shape_args(self) -> dict:
        return dict(n_k_heads=self.n_k_heads, n_v_heads=self.n_v_heads, head_dim=self.head_dim,
                    n_seqs=len(self.slots), eps=EPS)

    def reference(self, qkv=None, alpha=None, beta=None, state=None):
        """(out [T, Hv * D], new state) of the float64 loop, with some inputs replaced."""
        return delta_net_loop(self.qkv if qkv is None else qkv, self.alpha if alpha is None else alpha,
                              self.beta if beta is None else beta, self.dt_bias, self.ssm_a,
                              self.state if state is None else state, self.slots, **self.shape_args)

    def tokens(self, start: int, stop: int) -> "Case":
        """The same sequences, tokens start..stop-1 of each."""
        per = len(self.qkv) // len(self.slots)
        pick = np.concatenate([np.arange(s * per + start, s * per + stop) for s in range(len(self.slots))])
        return dataclasses.replace(self, qkv=self.qkv[pick], alpha=self.alpha[pick], beta=self.beta[pick])


def make_case(seed, *, n_k_heads, n_v_heads, head_dim, n_tokens, n_seqs=1, n_slots=None, decay=(0.5, 2.0)) -> Case:
    """Random inputs: a non-zero initial state in every slot, slots a permutation (not the identity
    where there is room). decay: the range of -ssm_a (with softplus(alpha + dt_bias) around 1)."""
    rng = np.random.default_rng(seed)
    d, hk, hv = head_dim, n_k_heads, n_v_heads
    n_slots = n_slots or n_seqs
    f32 = np.float32
    qkv = rng.standard_normal((n_tokens, (2 * hk + hv) * d)).astype(f32)
    alpha = rng.standard_normal((n_tokens, hv)).astype(f32)
    beta = (2 * rng.standard_normal((n_tokens, hv))).astype(f32)
    dt_bias = (0.5 * rng.standard_normal(hv)).astype(f32)
    ssm_a = (-rng.uniform(*decay, hv)).astype(f32)
    state = (0.3 * rng.standard_normal((n_slots, hv, d, d))).astype(f32)
    slots = rng.permutation(n_slots)[:n_seqs][::-1].astype(np.int32).copy()
    return Case(qkv, alpha, beta, dt_bias, ssm_a, state, slots, hk, hv, d)


def run_gdn(device, case: Case, chunked, *, tuning=None, workspace_bytes=None):
    """Run delta_net over the case's contiguous tensors: (out [T, Hv * D], new state, chunked used)."""
    from vkrt.ops.delta_net import delta_net, delta_net_workspace_bytes
    n_tok = len(case.qkv)
    hv, d = case.n_v_heads, case.head_dim
    arrays = [case.qkv, case.alpha, case.beta, case.dt_bias, case.ssm_a, case.state, case.slots,
              np.zeros((n_tok, hv * d), np.float32)]
    tensors = [tensor_from_numpy(device, a) for a in arrays]
    ws_bytes = workspace_bytes
    if ws_bytes is None and chunked is not False:
        ws_bytes = delta_net_workspace_bytes(device, hv, d, n_tok, len(case.slots), tuning=tuning)
    ws = tensor_from_numpy(device, np.zeros(ws_bytes // 4, np.float32)) if ws_bytes else None
    try:
        used = run_once(device, lambda seq: delta_net(seq, *tensors, **case.shape_args, workspace=ws, chunked=chunked,
                                                      tuning=tuning))
        return read_tensor(tensors[7]), read_tensor(tensors[5]), used
    finally:
        for t in tensors + [ws]:
            if t is not None:
                t.close()


def assert_close(got, want, tol=2e-5, what="out"):
    """Max error relative to the largest reference value: fp32 rounding stays near 1e-6; a wrong
    gate, norm, head mapping or chunk term gives errors of order one."""
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) / scale
    assert err < tol, f"{what}: max error {err:.3g} of the largest value {scale:.3g}"


def tuning_with(device, **fields):
    return dataclasses.replace(device.tuning, **fields)


# -- the algorithm itself ------------------------------------------------------------------------

@pytest.mark.parametrize("n_tokens, n_seqs, chunk", [(150, 1, 64), (20, 1, 64), (36, 3, 8), (64, 2, 16)])
def test_reference_chunked_algorithm_equals_loop(n_tokens, n_seqs, chunk):
    c = make_case(n_tokens, n_k_heads=2, n_v_heads=4, head_dim=8, n_tokens=n_tokens, n_seqs=n_seqs,
                  n_slots=n_seqs + 1, decay=(0.1, 8.0))
    want_o, want_s = c.reference()
    got_o, got_s = delta_net_chunked(c.qkv, c.alpha, c.beta, c.dt_bias, c.ssm_a, c.state, c.slots, **c.shape_args,
                                     chunk=chunk)
    np.testing.assert_allclose(got_o, want_o, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_s, want_s, rtol=0, atol=1e-12)


# -- each form against the loop, and against each other ----------------------------------------

@pytest.mark.parametrize("hk, hv, d, n_tokens, n_seqs, n_slots", [
    pytest.param(2, 4, 16, 150, 1, 2, id="prompt-of-several-chunks-padded-Hv=2Hk"),
    pytest.param(1, 1, 32, 20, 1, 1, id="shorter-than-a-chunk-Hv=Hk"),
    pytest.param(2, 4, 16, 12, 4, 7, id="4-sequences-in-7-slots"),
    pytest.param(2, 2, 32, 8, 8, 8, id="decode-8-sequences"),
])
def test_forms_match_loop_and_each_other(device, hk, hv, d, n_tokens, n_seqs, n_slots):
    c = make_case(n_tokens + d, n_k_heads=hk, n_v_heads=hv, head_dim=d, n_tokens=n_tokens, n_seqs=n_seqs,
                  n_slots=n_slots)
    want_o, want_s = c.reference()
    results = {}
    for chunked in (False, True):
        out, state, used = run_gdn(device, c, chunked)
        assert used is chunked
        assert_close(out, want_o, what=f"chunked={chunked} out")
        assert_close(state, want_s, what=f"chunked={chunked} state")
        untouched = np.setdiff1d(np.arange(n_slots), c.slots)
        np.testing.assert_array_equal(state[untouched], c.state[untouched])
        results[chunked] = out, state
    assert_close(results[True][0], results[False][0], what="chunked vs recurrent out")
    assert_close(results[True][1], results[False][1], what="chunked vs recurrent state")


@pytest.mark.parametrize("chunked", FORMS)
def test_continuing_a_sequence(device, chunked):
    """40 tokens, then 30 more from the state they left, equal 70 at once (two sequences)."""
    c = make_case(70, n_k_heads=1, n_v_heads=2, head_dim=16, n_tokens=140, n_seqs=2, n_slots=3)
    want_o, want_s = c.reference()
    first, second = c.tokens(0, 40), c.tokens(40, 70)
    out1, state1, _ = run_gdn(device, first, chunked)
    out2, state2, _ = run_gdn(device, dataclasses.replace(second, state=state1), chunked)
    both = np.concatenate([np.concatenate([out1[s * 40:(s + 1) * 40], out2[s * 30:(s + 1) * 30]]) for s in (0, 1)])
    assert_close(both, want_o)
    assert_close(state2, want_s, what="state")
    whole, whole_state, _ = run_gdn(device, c, chunked)
    assert_close(both, whole, what="split vs whole")
    assert_close(state2, whole_state, what="split vs whole state")


@pytest.mark.parametrize("chunked", FORMS)
@pytest.mark.parametrize("regime", ["long-decay", "no-decay", "softplus-linear"])
def test_gate_extremes(device, chunked, regime):
    """Strongly negative g (the state is forgotten within a token or two), g near 0 (the state
    keeps everything), and alpha + dt_bias far above 20 (softplus passes x through)."""
    c = make_case(7, n_k_heads=2, n_v_heads=4, head_dim=16, n_tokens=80, n_seqs=1, n_slots=1)
    if regime == "long-decay":
        c = dataclasses.replace(c, alpha=c.alpha + 4.0, ssm_a=c.ssm_a * 8.0)       # g around -40
    elif regime == "no-decay":
        c = dataclasses.replace(c, alpha=c.alpha - 18.0)                           # g around -1e-8
    else:
        c = dataclasses.replace(c, alpha=c.alpha + 100.0, ssm_a=c.ssm_a * 0.005)   # e^x overflows fp32
    want_o, want_s = c.reference()
    out, state, _ = run_gdn(device, c, chunked)
    assert_close(out, want_o)
    assert_close(state, want_s, what="state")


@pytest.mark.parametrize("chunked", FORMS)
def test_eps_floors_the_norm(device, chunked):
    """q and k of some tokens with norms below eps (scaled by 1 / eps, not normalised) or zero."""
    c = make_case(9, n_k_heads=2, n_v_heads=2, head_dim=16, n_tokens=24, n_slots=1)
    qkv = c.qkv.copy()
    kd = 2 * c.n_k_heads * c.head_dim
    rows = qkv[:, :kd].reshape(len(qkv), -1, c.head_dim)
    rows[::3] *= 3e-7 / np.linalg.norm(rows[::3], axis=-1, keepdims=True)   # norm 3e-7 < eps
    rows[1::6] = 0.0
    c = dataclasses.replace(c, qkv=qkv)
    want_o, want_s = c.reference()
    out, state, _ = run_gdn(device, c, chunked)
    assert_close(out, want_o)
    assert_close(state, want_s, what="state")


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_chunk_sizes(device, chunk):
    c = make_case(chunk, n_k_heads=2, n_v_heads=4, head_dim=32, n_tokens=2 * chunk + 5, n_slots=2)
    want_o, want_s = c.reference()
    out, state, used = run_gdn(device, c, True, tuning=tuning_with(device, gdn_chunk=chunk))
    assert used
    assert_close(out, want_o)
    assert_close(state, want_s, what="state")


def test_head_dim_128(device):
    """The real model's head size, both forms, two chunks."""
    c = make_case(128, n_k_heads=1, n_v_heads=2, head_dim=128, n_tokens=70, n_slots=2)
    want_o, want_s = c.reference()
    for chunked in (False, True):
        out, state, _ = run_gdn(device, c, chunked)
        assert_close(out, want_o, what=f"chunked={chunked} out")
        assert_close(state, want_s, what=f"chunked={chunked} state")


# -- layouts --------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunked", FORMS)
def test_strided_views(device, chunked):
    """qkv, alpha, beta and out as column views of wider tensors (qkv not 16-byte aligned); the
    state with padded rows, a head stride and a slot stride larger than a slot, in a block with
    other data. Nothing outside the views changes."""
    from vkrt.ops.delta_net import delta_net, delta_net_workspace_bytes
    c = make_case(11, n_k_heads=2, n_v_heads=4, head_dim=16, n_tokens=90, n_seqs=2, n_slots=3)
    d, hv, n_tok, n_slots = c.head_dim, c.n_v_heads, len(c.qkv), len(c.state)
    conv = c.qkv.shape[1]
    rng = np.random.default_rng(5)
    wide_qkv = rng.standard_normal((n_tok, conv + 7)).astype(np.float32)
    wide_qkv[:, 3:3 + conv] = c.qkv
    wide_ab = rng.standard_normal((n_tok, 2 * hv + 1)).astype(np.float32)
    wide_ab[:, 1:1 + hv], wide_ab[:, 1 + hv:] = c.alpha, c.beta
    wide_out = np.full((n_tok, hv * d + 4), 7.0, np.float32)
    row, head = d + 4, (d + 4) * d + 8                       # floats: padded rows, padded heads
    slot = head * hv + 12                                    # a slot's block holds more than the state
    block = np.full(16 + slot * n_slots, -3.0, np.float32)   # 16 floats before the first slot
    strided = np.lib.stride_tricks.as_strided(block[16:], shape=(n_slots, hv, d, d),
                                              strides=(4 * slot, 4 * head, 4 * row, 4))
    strided[...] = c.state
    keep = block.copy()
    arrays = [wide_qkv, wide_ab, wide_out, block, c.dt_bias, c.ssm_a, c.slots]
    t_qkv, t_ab, t_out, t_state, t_dt, t_a, t_slots = tensors = [tensor_from_numpy(device, a) for a in arrays]
    ws = None
    if chunked:
        ws = tensor_from_numpy(device, np.zeros(delta_net_workspace_bytes(device, hv, d, n_tok, 2) // 4, np.float32))
    try:
        qkv = t_qkv.view((conv, n_tok), nb=(4, 4 * (conv + 7)), offset=12)
        alpha = t_ab.view((hv, n_tok), nb=(4, 4 * (2 * hv + 1)), offset=4)
        beta = t_ab.view((hv, n_tok), nb=(4, 4 * (2 * hv + 1)), offset=4 + 4 * hv)
        out = t_out.view((hv * d, n_tok), nb=(4, 4 * (hv * d + 4)))
        state = t_state.view((d, d, hv, n_slots), nb=(4, 4 * row, 4 * head, 4 * slot), offset=64)
        run_once(device, lambda seq: delta_net(seq, qkv, alpha, beta, t_dt, t_a, state, t_slots, out,
                                               **c.shape_args, workspace=ws, chunked=chunked))
        got_out, got_block = read_tensor(t_out), read_tensor(t_state)
    finally:
        for t in tensors + [ws]:
            if t is not None:
                t.close()
    want_o, want_s = c.reference()
    assert_close(got_out[:, :hv * d], want_o)
    assert (got_out[:, hv * d:] == 7.0).all()
    got_s = np.lib.stride_tricks.as_strided(got_block[16:], shape=(n_slots, hv, d, d),
                                            strides=(4 * slot, 4 * head, 4 * row, 4)).copy()
    assert_close(got_s, want_s, what="state")
    marks = np.zeros(block.shape, np.float32)
    np.lib.stride_tricks.as_strided(marks[16:], shape=strided.shape, strides=strided.strides)[...] = 1.0
    outside = marks == 0.0
    assert outside.sum() == block.size - strided.size
    np.testing.assert_array_equal(got_block[outside], keep[outside])


# -- choosing the form, workspace, errors ----------------------------------------------------------

def test_auto_choice_follows_tuning_and_workspace(device):
    from vkrt.ops.delta_net import delta_net_workspace_bytes
    tun = tuning_with(device, gdn_chunk_min_tokens=32, gdn_chunk_max_seqs=2)
    c = make_case(3, n_k_heads=1, n_v_heads=2, head_dim=16, n_tokens=64, n_seqs=2, n_slots=2)
    need = delta_net_workspace_bytes(device, 2, 16, 64, 2, tuning=tun)
    want_o, _ = c.reference()
    for ws_bytes, expect in ((need, True), (need - 4, False), (0, False)):
        out, _, used = run_gdn(device, c, None, tuning=tun, workspace_bytes=ws_bytes)
        assert used is expect
        assert_close(out, want_o)
    for fields in (dict(gdn_chunk_min_tokens=33), dict(gdn_chunk_max_seqs=1)):
        _, _, used = run_gdn(device, c, None, tuning=dataclasses.replace(tun, **fields), workspace_bytes=need)
        assert used is False


def test_workspace_bytes(device):
    from vkrt.ops.delta_net import delta_net_workspace_bytes
    tun = tuning_with(device, gdn_chunk=64)
    block = 4 * (2 * 64 * 64 + 3 * 64 + 4)
    assert delta_net_workspace_bytes(device, 32, 128, 2048, tuning=tun) == 32 * 32 * block
    assert delta_net_workspace_bytes(device, 4, 16, 150, tuning=tun) == 4 * 3 * block
    assert delta_net_workspace_bytes(device, 4, 16, 150, 3, tuning=tun) == 3 * 4 * 1 * block
    with pytest.raises(OutOfRange, match="sequences of equal length"):
        delta_net_workspace_bytes(device, 4, 16, 150, 4)


def test_errors(device):
    from vkrt.memory import F32, I32, Tensor
    from vkrt.ops.delta_net import delta_net
    hk, hv, d, n_tok = 1, 2, 16, 4
    conv = (2 * hk + hv) * d
    made = []

    def t(typ, *ne):
        made.append(Tensor.empty(device, typ, ne))
        return made[-1]
    try:
        good = dict(qkv=t(F32, conv, n_tok), alpha=t(F32, hv, n_tok), beta=t(F32, hv, n_tok), dt_bias=t(F32, hv),
                    ssm_a=t(F32, hv), state=t(F32, d, d, hv, 2), slots=t(I32, 2), out=t(F32, hv * d, n_tok))
        shape = dict(n_k_heads=hk, n_v_heads=hv, head_dim=d, n_seqs=2, eps=EPS)

        def call(**kw):
            args = {**good, **shape, **kw}
            run_once(device, lambda seq: delta_net(seq, *(args.pop(k) for k in list(good)), **args))
        call()   # the baseline is valid
        with pytest.raises(OutOfRange, match="multiple of n_k_heads"):
            call(n_k_heads=3, n_v_heads=4)
        with pytest.raises(OutOfRange, match="do not split into 3 sequences"):
            call(n_seqs=3)
        with pytest.raises(UnsupportedShape, match="head_dim 24"):
            call(head_dim=24)
        with pytest.raises(OutOfRange, match=r"qkv must be \[64, T\]"):
            call(qkv=t(F32, conv + 1, n_tok))
        with pytest.raises(OutOfRange, match="alpha must be"):
            call(alpha=t(F32, hv + 1, n_tok))
        with pytest.raises(OutOfRange, match="ssm_a must have 2 elements"):
            call(ssm_a=t(F32, 3))
        with pytest.raises(OutOfRange, match="state must have ne"):
            call(state=t(F32, d, d, hv + 1, 2))
        with pytest.raises(UnsupportedShape, match="multiples of 16 bytes"):
            call(state=good["state"].view((d, d, hv, 1), nb=(4, 4 * d + 4, 4 * d * d + 64, 1 << 14)))
        with pytest.raises(GGMLTypeError, match="slots must be a contiguous I32"):
            call(slots=t(F32, 2))
        with pytest.raises(OutOfRange, match="out must be"):
            call(out=t(F32, hv * d, n_tok + 1))
        with pytest.raises(OutOfRange, match="overlaps"):
            call(out=good["qkv"].view((hv * d, n_tok)))
        with pytest.raises(OutOfRange, match="needs a workspace"):
            call(chunked=True)
        with pytest.raises(OutOfRange, match="need"):
            call(chunked=True, workspace=t(F32, 8))
        with pytest.raises(GGMLTypeError, match="workspace must be a contiguous F32"):
            call(chunked=True, workspace=t(I32, 1 << 16))
        with pytest.raises(ConfigError, match="gdn_chunk 48"):
            call(chunked=True, workspace=t(F32, 1 << 16), tuning=tuning_with(device, gdn_chunk=48))
    finally:
        for x in made:
            x.close()
