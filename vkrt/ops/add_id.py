"""ggml's add_id: a bias chosen per row by an id, out[:, j, t] = a[:, j, t] + b[:, ids[j, t]]
(gpt-oss adds its experts' biases to their projections this way)."""

from __future__ import annotations

from ..errors import OutOfRange
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor, f32_binding
from .grid import groups_for

ADD_ID_PUSH = PushConstants(*((n, "u32") for n in ("n", "rows", "n_used", "a_off", "b_off", "ids_off", "ids_tok",
                                                     "d_off")))


def add_id(seq, a: Tensor, b: Tensor, ids: Tensor, out: Tensor) -> None:
    """Record out = a + b[:, ids]: a, out F32 [n, n_used, n_tokens] contiguous (out may be a);
    b F32 [n, n_expert] contiguous; ids I32 [n_used, n_tokens] with contiguous rows, each id
    below n_expert."""
    n, n_used, n_tokens = a.ne[0], a.ne[1], a.ne[2]
    for t, what in ((a, "a"), (out, "out"), (b, "b")):
        if not t.is_contiguous():
            raise OutOfRange(f"add_id: {what} must be contiguous, got {t!r}")
    if out.ne != a.ne or a.ne[3] != 1:
        raise OutOfRange(f"add_id: a {list(a.ne)} and out {list(out.ne)} must be one 3-D shape")
    if b.ne[0] != n or b.ne[2] != 1 or b.ne[3] != 1:
        raise OutOfRange(f"add_id: b must be [{n}, n_expert], got {list(b.ne)}")
    if ids.type is not I32 or ids.ne[:2] != (n_used, n_tokens) or ids.nb[0] != 4 or ids.nb[1] % 4:
        raise OutOfRange(f"add_id: ids must be I32 [{n_used}, {n_tokens}] with contiguous rows, got {ids!r}")
    ar, ao, _ = f32_binding(a, "add_id a")
    br, bo, _ = f32_binding(b, "add_id b")
    dr, do, _ = f32_binding(out, "add_id out")
    ir, io = bind_tensor(ids, "add_id ids")
    k = kernel(seq.device, "add_id", push=ADD_ID_PUSH, workgroup=(seq.device.tuning.wg_size,))
    seq.dispatch(k, [ar, br, ir, dr], push=dict(n=n, rows=n_used * n_tokens, n_used=n_used, a_off=ao, b_off=bo,
                                                 ids_off=io // 4, ids_tok=ids.nb[1] // 4, d_off=do),
                 groups=groups_for(k, n * n_used * n_tokens), label="add_id")
