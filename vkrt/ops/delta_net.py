"""The gated delta rule: Gated DeltaNet's linear attention (qwen35, qwen35moe), as llama.cpp runs it.

Per sequence and value head h (key head h % n_k_heads), token by token, with S the head's D x D
state (S[i][j]: i value row, j key column):

    q = q / max(|q|, eps) / sqrt(D),   k = k / max(|k|, eps)
    g = softplus(alpha + dt_bias) * ssm_a,   b = sigmoid(beta)       (ssm_a < 0, so g <= 0)
    S = e^g S;   u = b (v - S k);   S = S + u k^T;   out = S q

Two forms compute it. The recurrent one (gdn_recurrent.comp) walks the tokens with rows of S in
registers: decode's path, one read and one write of the state. The chunked one (the WY / UT form
of the flash-linear-attention papers and llama.cpp's build_delta_net_chunking) splits each
sequence into chunks of C tokens: gdn_chunk_prep.comp builds each chunk's triangular inverse and
attention matrix in parallel into a workspace, gdn_chunk_scan.comp walks the chunks in order with
the state in shared memory, doing the per-token work as small matrix products.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..device.tuning import Tuning
from ..errors import ConfigError, GGMLTypeError, OutOfRange, UnsupportedShape
from ..memory import F32, I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind, bind_tensor, f32_binding
from .grid import ceil_div
from .reduce import subgroup_defines

HEAD_SIZES = "multiples of 16 from 16 to 256"
CHUNK_SIZES = (16, 32, 64)
DT = 16   # key columns the chunked kernels stage at a time (divides every head size)
SHARED_LIMIT = 32 << 10   # shared memory a kernel may use on every driver (lavapipe, AMDVLK)

_GATE_FIELDS = (("seq_tokens", "u32"), ("n_k_heads", "u32"), ("qkv_off", "u32"), ("qkv_s1", "u32"),
                ("alpha_off", "u32"), ("alpha_s1", "u32"), ("beta_off", "u32"), ("beta_s1", "u32"),
                ("dt_off", "u32"), ("a_off", "u32"))
_STATE_FIELDS = (("st_off", "u32"), ("st_s1", "u32"), ("st_s2", "u32"), ("st_s3", "u32"), ("slot_off", "u32"),
                 ("out_off", "u32"), ("out_s1", "u32"))
RECURRENT_PUSH = PushConstants(*_GATE_FIELDS, *_STATE_FIELDS, ("eps", "f32"))
RECURRENT_IN_PUSH = PushConstants(*_GATE_FIELDS, *_STATE_FIELDS, ("eps", "f32"), ("in_off", "u32"))
PREP_PUSH = PushConstants(*_GATE_FIELDS, ("ws_off", "u32"), ("eps", "f32"))
SCAN_PUSH = PushConstants(("seq_tokens", "u32"), ("n_chunks", "u32"), ("n_k_heads", "u32"), ("qkv_off", "u32"),
                          ("qkv_s1", "u32"), ("ws_off", "u32"), *_STATE_FIELDS)


@dataclass(frozen=True)
class RecurrentLayout:
    """gdn_recurrent.comp's workgroup: `wg` invocations, `lanes` of them sharing `rows` state rows."""

    wg: int
    lanes: int
    rows: int

    @property
    def rows_per_group(self) -> int:
        return self.wg // self.lanes * self.rows


@dataclass(frozen=True)
class ChunkLayout:
    """The chunked kernels' sizes: `chunk` tokens; the per-chunk pass's `prep_wg`; the walk's
    `scan_wg` invocations over `rows` state rows; `tt` tokens staged at a time in its state update."""

    chunk: int
    prep_wg: int
    scan_wg: int
    rows: int
    tt: int

    @property
    def block_floats(self) -> int:
        """Workspace floats of one chunk of one head: Tb and A (C x C each), 3 per-token factors, the decay."""
        return 2 * self.chunk * self.chunk + 3 * self.chunk + 4


def _check_head_dim(head_dim: int, op: str) -> None:
    if head_dim % 16 or not 16 <= head_dim <= 256:
        raise UnsupportedShape(f"{op}: head_dim {head_dim} is not supported; the kernels take {HEAD_SIZES}")


def recurrent_layout(tuning: Tuning, profile, head_dim: int) -> RecurrentLayout:
    """The recurrent kernel's layout for this head size from the tuning entry: lanes holding
    gdn_lane_vec4s vec4s of a row each (more where a workgroup would not fill a subgroup), within
    the device's subgroups (no shuffles: one lane a row) and workgroup limit."""
    _check_head_dim(head_dim, "delta_net")
    rows, per_lane = tuning.gdn_rows, tuning.gdn_lane_vec4s
    if per_lane < 1 or rows < 1 or head_dim % rows:
        raise ConfigError(f"tuning for {tuning.arch.value}: gdn_lane_vec4s {per_lane} and gdn_rows {rows} must be "
                          f"positive, gdn_rows dividing head_dim {head_dim}")
    most = min(head_dim // 4, profile.subgroup_min) if profile.subgroup_shuffle else 1
    candidates = []
    for lanes in (1 << i for i in range(most.bit_length())):
        wg = min(tuning.gdn_wg, profile.max_workgroup_invocations)
        while wg > lanes and (wg // lanes * rows > head_dim or head_dim % (wg // lanes * rows)):
            wg //= 2
        if (head_dim // 4) % lanes == 0 and wg % lanes == 0 and head_dim % (wg // lanes * rows) == 0:
            candidates.append(RecurrentLayout(wg, lanes, rows))
    if not candidates:
        raise ConfigError(f"tuning for {tuning.arch.value}: gdn_wg {tuning.gdn_wg} x gdn_rows {rows} do not tile "
                          f"head_dim {head_dim}")
    enough = min(tuning.gdn_wg, tuning.subgroup)
    fitting = [c for c in candidates if 4 * c.lanes * per_lane >= head_dim and c.wg >= enough]
    return fitting[0] if fitting else max(candidates, key=lambda c: (c.wg, -c.lanes))


def chunk_layout(tuning: Tuning, profile, head_dim: int) -> ChunkLayout:
    """The chunked kernels' layout for this head size from the tuning entry."""
    _check_head_dim(head_dim, "delta_net")
    c = tuning.gdn_chunk
    if c not in CHUNK_SIZES:
        raise ConfigError(f"tuning for {tuning.arch.value}: gdn_chunk {c} is not one of {CHUNK_SIZES}")
    prep = min(tuning.gdn_prep_wg, c * c // 4, profile.max_workgroup_invocations)
    if prep < c or prep & (prep - 1):
        raise ConfigError(f"tuning for {tuning.arch.value}: gdn_prep_wg {tuning.gdn_prep_wg} must be a power of "
                          f"two of at least gdn_chunk {c}")
    tt = c
    while tt > 1 and tt * head_dim > 2 * c * (DT + 1):
        tt //= 2
    limit = min(SHARED_LIMIT, profile.shared_memory)

    def fits(wg: int, rb: int) -> bool:
        nr = rb // 4
        return (head_dim % rb == 0 and wg % nr == 0 and c % (wg // nr) == 0 and head_dim % (wg // nr) == 0
                and c * DT % wg == 0 and tt * head_dim % wg == 0 and c * min(32, c) % wg == 0
                and scan_shared_bytes(head_dim, c, rb, tt) <= limit)
    # rows: gdn_scan_state floats an invocation, or the fewest the workgroup can tile; a smaller
    # workgroup (down to a subgroup) where none fits
    scan = min(tuning.gdn_scan_wg, profile.max_workgroup_invocations)
    while True:
        feasible = [rb for rb in (4 << i for i in range(7)) if rb <= head_dim and fits(scan, rb)]
        if feasible:
            want = max(scan * tuning.gdn_scan_state // head_dim, feasible[0])
            return ChunkLayout(c, prep, scan, max(rb for rb in feasible if rb <= want), tt)
        if scan <= max(1, tuning.subgroup):
            raise ConfigError(f"tuning for {tuning.arch.value}: no gdn_chunk_scan layout for head_dim {head_dim} "
                              f"and chunk {c}")
        scan //= 2


def scan_shared_bytes(head_dim: int, chunk: int, rows: int, tt: int) -> int:
    """Shared memory of gdn_chunk_scan.comp: the state block, the staging area, X / Vn."""
    return 4 * (head_dim * rows + max(2 * chunk * (DT + 1), tt * head_dim) + chunk * rows)


def delta_net_workspace_bytes(device, n_v_heads: int, head_dim: int, n_tokens: int, n_seqs: int = 1, *,
                              tuning: Tuning | None = None) -> int:
    """Bytes of the workspace the chunked form needs for n_tokens tokens in n_seqs sequences of equal
    length (each sequence's last chunk is padded, so more sequences may need more). Allocate it
    once, for the largest call, and pass it to every delta_net call."""
    if n_seqs < 1 or n_tokens % n_seqs:
        raise OutOfRange(f"delta_net: {n_tokens} tokens do not split into {n_seqs} sequences of equal length")
    lay = chunk_layout(tuning or device.tuning, device.profile, head_dim)
    chunks = ceil_div(n_tokens // n_seqs, lay.chunk)
    return 4 * n_seqs * n_v_heads * chunks * lay.block_floats



def _vec4_binding(t: Tensor, what: str):
    """(range, element offset, element strides) of an F32 tensor read 4 elements at a time: its
    offset and strides must be multiples of 16 bytes."""
    b = bind(t, what, unit=4, dtype=F32, contiguous=True, min_align=16)
    if t.offset % 16 or any(s % 16 for s in t.nb[1:]):
        raise UnsupportedShape(f"{what}: the kernels read it 4 floats at a time; its offset ({t.offset}) and "
                               f"strides {t.nb} must be multiples of 16 bytes")
    return b.range, b.offset, b.strides[1:]


def _check_operands(qkv, alpha, beta, dt_bias, ssm_a, state, slots, out, hk: int, hv: int, d: int,
                    n_seqs: int, slot_values: int) -> None:
    op = "delta_net"
    _check_head_dim(d, op)
    if hk < 1 or hv < 1 or hv % hk:
        raise OutOfRange(f"{op}: n_v_heads {hv} must be a positive multiple of n_k_heads {hk}")
    conv_dim = (2 * hk + hv) * d
    n_tokens = qkv.ne[1]
    if qkv.ne != (conv_dim, n_tokens, 1, 1):
        raise OutOfRange(f"{op}: qkv must be [{conv_dim}, T] (2 * {hk} key heads + {hv} value heads of {d}), "
                         f"got {list(qkv.ne)}")
    if n_seqs < 1 or n_tokens % n_seqs:
        raise OutOfRange(f"{op}: {n_tokens} tokens do not split into {n_seqs} sequences of equal length")
    for t, name in ((alpha, "alpha"), (beta, "beta")):
        if t.ne != (hv, n_tokens, 1, 1):
            raise OutOfRange(f"{op}: {name} must be [{hv}, {n_tokens}], got {list(t.ne)}")
    for t, name in ((dt_bias, "dt_bias"), (ssm_a, "ssm_a")):
        if t.ne[0] != hv or t.nelements != hv:
            raise OutOfRange(f"{op}: {name} must have {hv} elements, has shape {list(t.ne)}")
    if state.ne[:3] != (d, d, hv):
        raise OutOfRange(f"{op}: state must have ne ({d}, {d}, {hv}, n_slots), got {list(state.ne)}")
    if out.ne != (hv * d, n_tokens, 1, 1):
        raise OutOfRange(f"{op}: out must be [{hv * d}, {n_tokens}], got {list(out.ne)}")
    if slots.type is not I32 or slots.nelements != slot_values or not slots.is_contiguous():
        raise GGMLTypeError(f"{op}: slots must be a contiguous I32 tensor of {slot_values}, got {slots!r}")
    for a, b, what in ((out, qkv, "qkv"), (out, alpha, "alpha"), (out, beta, "beta"), (out, state, "state"),
                       (state, qkv, "qkv"), (state, alpha, "alpha"), (state, beta, "beta")):
        if a.overlaps(b):
            raise OutOfRange(f"{op}: {a!r} overlaps {what} {b!r}")


def _check_workspace(workspace: Tensor | None, need: int, n_tokens: int, n_seqs: int, others) -> Tensor:
    """The first `need` bytes of the workspace, checked."""
    op = "delta_net"
    if workspace is None:
        raise OutOfRange(f"{op}: the chunked form needs a workspace of {need} bytes (delta_net_workspace_bytes)")
    if workspace.type is not F32 or not workspace.is_contiguous():
        raise GGMLTypeError(f"{op}: workspace must be a contiguous F32 tensor, got {workspace!r}")
    if workspace.nbytes < need:
        raise OutOfRange(f"{op}: workspace {workspace!r} has {workspace.nbytes} bytes; {n_tokens} tokens in "
                         f"{n_seqs} sequences need {need}")
    for t in others:
        if workspace.overlaps(t):
            raise OutOfRange(f"{op}: workspace {workspace!r} overlaps {t!r}")
    return workspace.view((need // 4,))


def delta_net(seq, qkv: Tensor, alpha: Tensor, beta: Tensor, dt_bias: Tensor, ssm_a: Tensor, state: Tensor,
              slots: Tensor, out: Tensor, *, n_k_heads: int, n_v_heads: int, head_dim: int, n_seqs: int,
              eps: float, workspace: Tensor | None = None, chunked: bool | None = None,
              tuning: Tuning | None = None, span: bool = False, state_in: Tensor | None = None) -> bool:
    """Record the gated delta rule over T tokens: n_seqs sequences of T / n_seqs consecutive tokens.

    qkv: F32 [2 * Hk * D + Hv * D, T] (dim 0 contiguous, any column stride): per token the query
    heads (rows j*D..), the key heads (Hk*D + j*D..), the value heads (2*Hk*D + h*D..), all raw
    (normalised and gated here). alpha, beta: F32 [Hv, T] raw projections (any column stride).
    dt_bias, ssm_a: F32 [Hv] (ssm_a = -exp(A_log)). state: F32 view ne (D, D, Hv, n_slots),
    element (j, i, h, slot) = S_h[i][j] of the slot; offset and strides multiples of 16 bytes (any
    slot stride); updated in place. slots: I32 [n_seqs], each sequence's slot (distinct, below
    n_slots; read on the device). out: F32 [Hv * D, T] (any column stride), out[h*D + i, t].
    Hk = n_k_heads, Hv = n_v_heads (a multiple of Hk; value head h reads key head h % Hk),
    D = head_dim. out must not overlap the inputs or the state.

    chunked: None takes the chunked form when a sequence has at least tuning.gdn_chunk_min_tokens
    tokens, there are at most tuning.gdn_chunk_max_seqs sequences and `workspace` (F32,
    delta_net_workspace_bytes) is large enough, else the recurrent form; True / False force one
    (True needs the workspace). tuning: another table entry (tests). Returns whether the chunked
    form was recorded.

    span: one sequence (n_seqs 1) over the columns slots[1] .. slots[1] + slots[2] - 1 of qkv,
    alpha, beta and out, slots an I32 [3] (slot, first, count) read on the device (the recurrent
    form: a catch-up recorded once for any span; count >= 1 and the span inside T are the
    caller's to keep). state_in (with span): F32 (D, D, Hv), the state to start from (a
    snapshot) with the slot's strides; the slot's state is written, not read.
    """
    op = "delta_net"
    dev = seq.device
    tuning = tuning or dev.tuning
    hk, hv, d = n_k_heads, n_v_heads, head_dim
    if span and (n_seqs != 1 or chunked):
        raise OutOfRange(f"{op}: a span is one sequence in the recurrent form (n_seqs {n_seqs}, chunked {chunked})")
    if state_in is not None and (not span or state_in.ne[:3] != state.ne[:3] or state_in.nb[:3] != state.nb[:3]
                                 or state_in.overlaps(state)):
        raise OutOfRange(f"{op}: state_in {state_in!r} must go with a span, be laid out as a slot of the state "
                         f"{state!r} and lie apart from it")
    _check_operands(qkv, alpha, beta, dt_bias, ssm_a, state, slots, out, hk, hv, d, n_seqs,
                    slot_values=3 if span else n_seqs)
    n_tokens = qkv.ne[1]
    seq_tokens = n_tokens // n_seqs
    if chunked is None:
        chunked = not span and (seq_tokens >= tuning.gdn_chunk_min_tokens and n_seqs <= tuning.gdn_chunk_max_seqs
                   and workspace is not None
                   and workspace.nbytes >= delta_net_workspace_bytes(dev, hv, d, n_tokens, n_seqs, tuning=tuning))

    xr, xo, xs = f32_binding(qkv, f"{op} qkv")
    ar, ao, as_ = f32_binding(alpha, f"{op} alpha")
    br, bo, bs = f32_binding(beta, f"{op} beta")
    dr, do, _ = f32_binding(dt_bias, f"{op} dt_bias")
    er, eo, _ = f32_binding(ssm_a, f"{op} ssm_a")
    sr, so, ss = _vec4_binding(state, f"{op} state")
    yr, yo, ys = f32_binding(out, f"{op} out")
    lr, lo = bind_tensor(slots, "delta_net slots")
    gates = dict(seq_tokens=seq_tokens, n_k_heads=hk, qkv_off=xo, qkv_s1=xs[0], alpha_off=ao, alpha_s1=as_[0],
                 beta_off=bo, beta_s1=bs[0], dt_off=do, a_off=eo)
    state_push = dict(st_off=so, st_s1=ss[0], st_s2=ss[1], st_s3=ss[2], slot_off=lo // 4, out_off=yo, out_s1=ys[0])

    if not chunked:
        lay = recurrent_layout(tuning, dev.profile, d)
        emulated = subgroup_defines(dev) if lay.lanes > 1 else {}
        defines = dict(D=d, LANES=lay.lanes, ROWS=lay.rows, **emulated, **({"WG": lay.wg} if emulated else {}),
                       **({"SPAN": 1} if span else {}), **({"STATE_IN": 1} if state_in is not None else {}))
        buffers, push = [xr, ar, br, dr, er, sr, lr, yr], dict(gates, **state_push, eps=float(eps))
        if state_in is not None:
            ir, io, _ = _vec4_binding(state_in, f"{op} state_in")
            buffers.append(ir)
            push["in_off"] = io
        k = kernel(dev, "gdn_recurrent", defines=defines, workgroup=(lay.wg,),
                   push=RECURRENT_PUSH if state_in is None else RECURRENT_IN_PUSH)
        seq.dispatch(k, buffers, push=push, groups=(d // lay.rows_per_group, hv, n_seqs), label="gdn_recurrent")
        return False

    need = delta_net_workspace_bytes(dev, hv, d, n_tokens, n_seqs, tuning=tuning)
    ws = _check_workspace(workspace, need, n_tokens, n_seqs, (qkv, alpha, beta, state, out))
    wr, wo, _ = _vec4_binding(ws, f"{op} workspace")
    lay = chunk_layout(tuning, dev.profile, d)
    n_chunks = ceil_div(seq_tokens, lay.chunk)
    unroll = int(tuning.gdn_unroll)
    prep = kernel(dev, "gdn_chunk_prep", defines=dict(D=d, C=lay.chunk, DT=DT, WG=lay.prep_wg, UNROLL=unroll),
                  push=PREP_PUSH)
    seq.dispatch(prep, [xr, ar, br, dr, er, wr], push=dict(gates, ws_off=wo, eps=float(eps)),
                 groups=(n_chunks, hv, n_seqs), label="gdn_chunk_prep")
    scan = kernel(dev, "gdn_chunk_scan", defines=dict(D=d, C=lay.chunk, RB=lay.rows, WG=lay.scan_wg, DT=DT,
                                                      TT=lay.tt, UNROLL=unroll), push=SCAN_PUSH)
    seq.dispatch(scan, [xr, wr, sr, lr, yr], push=dict(seq_tokens=seq_tokens, n_chunks=n_chunks, n_k_heads=hk,
                                                       qkv_off=xo, qkv_s1=xs[0], ws_off=wo, **state_push),
                 groups=(d // lay.rows, hv, n_seqs), label="gdn_chunk_scan")
    return True
