"""Rotary position embedding (llama.cpp's NORMAL, NEOX and the multi-section MROPE / IMROPE
modes, with YaRN scaling as ggml_rope_ext) with positions read from a tensor, so a recorded
sequence can be replayed at new positions."""

from __future__ import annotations

import math

import numpy as np

from ..errors import GGMLTypeError, OutOfRange
from ..memory import I32, Tensor
from ..pipeline import PushConstants, kernel
from .binding import bind_tensor, f32_binding
from .grid import groups_for
from .rows import same_shape

ROPE_PUSH = PushConstants(
    ("head_dim", "u32"), ("n_dims", "u32"), ("n_head", "u32"), ("n_tokens", "u32"),
    ("x_off", "u32"), ("x_s1", "u32"), ("x_s2", "u32"), ("y_off", "u32"), ("y_s1", "u32"), ("y_s2", "u32"),
    ("pos_off", "u32"), ("ff_off", "u32"), ("use_ff", "u32"), ("neox", "u32"),
    ("theta_scale", "f32"), ("freq_scale", "f32"), ("attn_factor", "f32"),
    ("ext_factor", "f32"), ("corr_low", "f32"), ("corr_high", "f32"),
    ("interleaved", "u32"), ("sections", "uvec4"), ("temp_scale", "f32"), ("temp_floor", "f32"))

POSITION_STREAMS = 4  # t, h, w, e: the position streams of sectioned rope


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """YaRN's correction dims (ggml_rope_yarn_corr_dims, in float32 as ggml): the pairs whose
    wavelength turns beta_fast and beta_slow times over n_ctx_orig positions, floored and ceiled
    into [0, n_dims - 1]."""
    f32 = np.float32

    def corr_dim(n_rot: float) -> float:
        ratio = f32(f32(n_ctx_orig) / f32(f32(n_rot) * f32(2) * f32(math.pi)))
        return float(f32(f32(n_dims) * f32(np.log(ratio))) / f32(f32(2) * f32(np.log(f32(freq_base)))))

    start, end = math.floor(corr_dim(beta_fast)), math.ceil(corr_dim(beta_slow))
    return float(max(0, start)), float(min(n_dims - 1, end))


def rope_operands(x: Tensor, positions: Tensor, *, n_dims: int, freq_base: float, freq_scale: float = 1.0,
                  neox: bool | None = None, freq_factors: Tensor | None = None, attn_factor: float = 1.0,
                  sections: tuple[int, int, int, int] | None = None, interleaved: bool = False,
                  ext_factor: float = 0.0, n_ctx_orig: int = 0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                  attn_temp: tuple[float, int] | None = None, op: str = "rope") -> tuple[list, dict]:
    """Checks x [head_dim, n_head, n_tokens] and the rotation's arguments; returns the bindings of
    positions and frequency factors and the push fields they share with norm_rope.

    Pairs are (2i, 2i+1) (NORMAL) or, with neox, (i, i + n_dims/2); dims past n_dims pass through.
    sections=(t, h, w, e) pair counts selects multi-section rope as ggml's rope_multi: NEOX pairs
    (neox None or True), positions I32 [4 * n_tokens] holding the streams t, h, w, e one after
    the other, and pair i rotated by the stream its sector i % sum(sections) picks: consecutive
    ranges (MROPE, Qwen2-VL) or, with interleaved, sector % 3 within 3 * sections (IMROPE).
    ext_factor != 0 turns on YaRN (ggml_rope_ext's ext_factor, n_ctx_orig, beta_fast, beta_slow;
    attn_factor scales cos and sin as there). attn_temp = (scale, floor_scale): the attention
    temperature, every output of the token at position p times log(floor(p / floor_scale) + 1) *
    scale + 1 (mistral3's queries; rope.glsl)."""
    head_dim, n_head, n_tokens = x.ne[0], x.ne[1], x.ne[2]
    if x.ne[3] != 1:
        raise OutOfRange(f"{op}: x must be 3-D [head_dim, n_head, n_tokens], got {list(x.ne)}")
    if head_dim % 2 or n_dims % 2 or not 0 < n_dims <= head_dim:
        raise OutOfRange(f"{op}: n_dims {n_dims} must be even and at most the (even) head size {head_dim}")
    streams = 1
    if sections is not None:
        sections = tuple(int(s) for s in sections)
        if len(sections) != POSITION_STREAMS or min(sections) < 0 or not 0 < sum(sections) <= head_dim:
            raise OutOfRange(f"{op}: sections must be {POSITION_STREAMS} pair counts >= 0 with a sum in "
                             f"1..{head_dim} (the head size), got {sections}")
        if neox is False:
            raise OutOfRange(f"{op}: sectioned rope (MROPE / IMROPE) pairs dims NEOX-style; neox=False conflicts")
        neox, streams = True, POSITION_STREAMS
    elif interleaved:
        raise OutOfRange(f"{op}: interleaved (IMROPE) needs sections")
    if positions.type is not I32 or positions.nelements < streams * n_tokens or not positions.is_contiguous():
        want = f"{n_tokens}" if streams == 1 else f"{streams} streams (t, h, w, e) of {n_tokens}"
        raise GGMLTypeError(f"{op}: positions must be a contiguous I32 tensor of {want}, got {positions!r}")
    pr, po = bind_tensor(positions, f"{op} positions")
    if freq_factors is not None:
        if freq_factors.nelements < n_dims // 2:
            raise OutOfRange(f"{op}: freq_factors need {n_dims // 2} values, got {freq_factors.nelements}")
        fr, fo, _ = f32_binding(freq_factors, f"{op} freq_factors")
    else:
        fr, fo = pr, 0
    corr = (0.0, 0.0)
    if ext_factor:
        if n_ctx_orig <= 0:
            raise OutOfRange(f"{op}: YaRN (ext_factor {ext_factor}) needs the original context length, "
                             f"got {n_ctx_orig}")
        corr = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    temp_scale, temp_floor = attn_temp or (0.0, 1)
    if attn_temp is not None and (not temp_scale or temp_floor <= 0):
        raise OutOfRange(f"{op}: the attention temperature needs a scale and a floor scale above 0, got {attn_temp}")
    push = dict(head_dim=head_dim, n_dims=n_dims, n_head=n_head, n_tokens=n_tokens, pos_off=po // 4, ff_off=fo,
                use_ff=int(freq_factors is not None), neox=int(bool(neox)),
                theta_scale=float(freq_base) ** (-2.0 / n_dims), freq_scale=float(freq_scale),
                attn_factor=float(attn_factor), ext_factor=float(ext_factor), corr_low=corr[0], corr_high=corr[1],
                interleaved=int(bool(interleaved)),
                sections=sections or (0, 0, 0, 0), temp_scale=float(temp_scale), temp_floor=float(temp_floor))
    return [pr, fr], push


def rope_flag_defines(push: dict) -> dict:
    """The rotation's flags (rope_operands' push fields) as defines, for kernels whose push
    block has no room for them (rope.glsl's rope_stream_defined reads them): ROPE_NEOX,
    ROPE_USE_FF, ROPE_INTERLEAVED, and ROPE_SECTIONS where there are sections."""
    defines = {"ROPE_NEOX": int(push["neox"]), "ROPE_USE_FF": int(push["use_ff"]),
               "ROPE_INTERLEAVED": int(push["interleaved"])}
    if any(push["sections"]):
        defines["ROPE_SECTIONS"] = ",".join(str(int(v)) for v in push["sections"])
    return defines


def rope_defines(push: dict) -> dict:
    """The shader defines for rope_operands' push fields: SECTIONS compiles the stream choice in,
    ATTN_TEMP the attention temperature."""
    return {**({"SECTIONS": 1} if any(push["sections"]) else {}), **({"ATTN_TEMP": 1} if push["temp_scale"] else {})}


def rope(seq, x: Tensor, positions: Tensor, out: Tensor, **rope_args) -> None:
    """Record out = rope(x) for x [head_dim, n_head, n_tokens] F32 and positions I32 [n_tokens]
    (with sections [4 * n_tokens]); rope_args: n_dims, freq_base, freq_scale, neox, freq_factors,
    attn_factor, sections, interleaved, ext_factor, n_ctx_orig, beta_fast, beta_slow, attn_temp (see
    rope_operands)."""
    same_shape(x, out, "rope")
    (pr, fr), push = rope_operands(x, positions, **rope_args)
    xr, xo, xs = f32_binding(x, "rope x")
    yr, yo, ys = f32_binding(out, "rope out")
    dev = seq.device
    k = kernel(dev, "rope", defines=rope_defines(push), push=ROPE_PUSH, workgroup=(dev.tuning.wg_size,))
    n = x.ne[0] // 2 * x.ne[1] * x.ne[2]
    seq.dispatch(k, [xr, pr, fr, yr], push=dict(push, x_off=xo, x_s1=xs[0], x_s2=xs[1], y_off=yo, y_s1=ys[0],
                                                 y_s2=ys[1]), groups=groups_for(k, n), label="rope")
