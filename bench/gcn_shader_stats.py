"""Compiler statistics of the GCN kernels: registers, spills, LDS, waves per SIMD, code size.

    python bench/gcn_shader_stats.py [--json] [--weights Q4_0,Q4_K,Q6_K,IQ2_XXS,...] [--kv f16,q8_0,...|all]

Builds (never runs) the kernel variants that prefill (ubatch 512) and decode (one token) of a
Qwen3-30B-A3B-shaped MoE model use with the AMD_GCN tuning: hidden 2048, 128 experts, 8 used,
expert FFN 768, head 128 (and 256 for flash attention), 32 query / 4 KV heads, Q4_0, Q4_K and
Q6_K weights, f16 KV cache; and the kernels Qwen3.5-35B-A3B adds (QWEN35): the DeltaNet layers' conv
with state, delta rule (recurrent for decode, chunked for prefill) and gated norm at 16 q/k and
32 v heads of 128, the gated attention's IMROPE norm_rope at head 256 and its sigmoid gate. Each pipeline is built by the op's own code -- the matmul helpers
gemm_kernel and mat_vec_kernel; rms_norm, rope, moe_route and FlashAttn, which build theirs
while recording, recorded over placeholder tensors -- and prints what the driver reports
through VK_KHR_pipeline_executable_properties (RADV/ACO: VGPRs, SGPRs, spills, LDS, "Subgroups
per SIMD" = waves a SIMD can hold, instructions, code bytes), one row per pipeline with the
places that use it. --json prints one object with every statistic the driver reports;
--weights names the weight types of the matmul kernels (default Q4_0,Q4_K,Q6_K; `all`: every
type with kernels); --kv builds only flash attention, at head 64, 128 and 256 for prefill and
decode (F16 and F32 also with the q/k norm, RoPE and cache stores in its prologue), with K and V
of each KV cache type named. --loop adds each kernel's main (longest) loop from the compiler's
assembly (bench/isa_loop.py: instructions, VALU, multiply-adds, conversions, moves; every loop
in --json; RADV only).

`--any-device` reads another device (the kernels its own tuning picks) and prints the statistics
its driver names: NVIDIA reports "Register Count" and "Shared Memory Size" (used for the decode
attention's occupancy, docs/results/2026-12-07-mask-zero-decode.md).

Needs a GCN device whose driver has VK_KHR_pipeline_executable_properties: an RX 470-590 on
RADV, or without one Mesa's null RADV device (no hardware; ACO compiles for Polaris):

    RADV_FORCE_FAMILY=polaris10 VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/radeon_icd.x86_64.json \\
        python bench/gcn_shader_stats.py

The device is opened without queues and nothing is allocated or submitted (the null device
has neither queues that run work nor memory): the recorded ops see tensors over a placeholder
buffer and dispatch into a Recorder that only keeps the kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from vkrt.device import Arch, Device
from vkrt.errors import VkrtError
from vkrt.memory import F16, F32, I32, BufferRange, Tensor
from vkrt.ops.argmax import MAX_PARTS, argmax
from vkrt.ops.delta_net import delta_net, delta_net_workspace_bytes
from vkrt.ops.gdn_catch_up import catch_up_windows
from vkrt.ops.elementwise import gate_mul
from vkrt.ops.fa_norm_rope import fa_norm_rope
from vkrt.ops.flash_attn import FlashAttn, mask_opt_kernel
from vkrt.ops.hadamard import k_rotation, v_rotation
from vkrt.ops.kv_quant import KV_QUANT, KV_TYPES, kv_type
from vkrt.ops.mat_vec import MV_WIDE, mat_vec_kernel
from vkrt.ops.matmul import SPLIT_SUM_PUSH, gemm_kernel, gemm_tuning, matmul, norm_input, vec4_ok
from vkrt.ops.moe import ExpertSum, moe_route, route_epilogue
from vkrt.ops.norm import rms_norm
from vkrt.ops.norm_rope import norm_rope
from vkrt.ops.quant import kernel_type, supported_types
from vkrt.ops.rope import rope
from vkrt.ops.ssm_conv import ssm_conv
from vkrt.pipeline import kernel, pipeline_representations, pipeline_statistics

from isa_loop import loop_counts, loops

ENV_HINT = ("RADV_FORCE_FAMILY=polaris10 VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/radeon_icd.x86_64.json "
            "selects Mesa's null Polaris device")
MODEL = dict(hidden=2048, n_expert=128, n_used=8, ff_expert=768, head=128, n_head=32, n_head_kv=4,
             ubatch=512, n_kv=4096, weights=("Q4_0", "Q4_K", "Q6_K"))
QWEN35 = dict(head=256, n_head=16, n_head_kv=2, rope_dims=64, sections=(11, 11, 10, 0), ssm_head=128, k_heads=16,
              v_heads=32, conv=4)


class Unbacked:
    """Stands in for a buffer of `device` where only tensor geometry matters (no memory behind it)."""

    handle = None
    closed = False
    size = 1 << 40

    def __init__(self, device, label: str):
        self.device = device
        self.label = label


def placeholder(dev, typ, ne, name: str) -> Tensor:
    """A contiguous tensor of `typ` and sizes `ne` over an Unbacked buffer."""
    return Tensor.on(BufferRange(Unbacked(dev, name), 0, Unbacked.size), typ, ne, name)


class Recorder:
    """Takes a CommandSequence's place for ops that build pipelines while recording: checks
    each dispatch's bindings and push constants against the kernel and keeps the kernel."""

    def __init__(self, device):
        self.device = device
        self.kernels = []

    def dispatch(self, kern, buffers, push=None, groups=(1, 1, 1), label=None) -> None:
        if len(buffers) != len(kern.bindings):
            raise VkrtError(f"{kern.label}: {len(buffers)} buffers for {len(kern.bindings)} bindings")
        if isinstance(push, dict):
            kern.push.pack(push)
        self.kernels.append(kern)


def recorded(dev, op) -> list:
    """The kernels op(seq) dispatches."""
    rec = Recorder(dev)
    op(rec)
    return rec.kernels


def flash_attn_cases(dev, hs: int, n_q: int, phase: str, both: tuple = (), prologue: bool = False,
                     tuning=None, note: str = "", cache_type=F16) -> list[tuple[str, list]]:
    """(where, pipelines) of FlashAttn for head size `hs` and `n_q` queries against MODEL's n_kv
    keys, mask_opt as the tuning rule says or `both` (False, True), the live cells read from a
    buffer as the engine does. mask_opt and split-K are push constants of one attention pipeline
    (the last split merges); mask_opt adds the pre-pass. `prologue` (one query): the q/k norm,
    RoPE and cache stores in the attention's prologue (the fa_rope fusion). `tuning` (default the
    device's) with `note` added to the row's place. `cache_type`: the K and V caches' type."""
    m = MODEL
    q = placeholder(dev, F32, (hs, n_q, m["n_head"], 1), "q")
    k = placeholder(dev, cache_type, (hs, m["n_kv"], m["n_head_kv"], 1), "k")
    v = placeholder(dev, cache_type, (hs, m["n_kv"], m["n_head_kv"], 1), "v")
    mask = placeholder(dev, F16, (m["n_kv"], n_q), "mask")
    o = placeholder(dev, F32, (hs, m["n_head"], n_q, 1), "out")
    used = placeholder(dev, I32, (1,), "kv_used")
    pro = None
    if prologue:
        raw = [placeholder(dev, F32, (hs, n, 1), name) for n, name in ((m["n_head"], "q"), (m["n_head_kv"], "k"),
                                                                      (m["n_head_kv"], "v"))]
        w, one = placeholder(dev, F32, (hs,), "norm"), placeholder(dev, I32, (1,), "pos")
    # a quantised cache is stored rotated (the engine's default): the prologue rotates the rows it
    # stores, the attention rotates V's output back
    quantised = cache_type.name in KV_QUANT
    out_rot = v_rotation(hs) if quantised else 0
    if prologue:
        pro = fa_norm_rope(dev, *raw, one, one, k, v, q_weight=w, k_weight=w, eps=1e-6,
                           rope_args=dict(n_dims=hs, freq_base=1e6, neox=True),
                           k_rot=k_rotation(hs) if quantised else 0, v_rot=out_rot)
    rec = Recorder(dev)
    # mask_opt off and no split: FlashAttn then needs no FlashWork (the null device has no memory)
    flag = placeholder(dev, I32, (1,), "mask_zero")   # as the engine: its decode-sized calls may skip the mask
    fa = FlashAttn(dev, q, k, v, o, mask, scale=hs ** -0.5, mask_opt=False, split_k=1, kv_used=used, prologue=pro,
                   tuning=tuning, out_rot=out_rot, mask_zero=flag)
    if prologue and fa.prologue is None:
        return []
    fa.record(rec)
    # what FlashAttn decides by itself, without the forced values
    rule, rows, bc = fa.decide_mask_opt(mask), fa.mask_rows, fa.tile.bc
    cases = []
    for on in both or (rule,):
        pre_pass = [mask_opt_kernel(dev, rows, bc)] if on else []
        where = f"{phase} flash attention head {hs}, mask_opt {'on' if on else 'off'}"
        if prologue:
            where += f", the q/k norm, RoPE and {cache_type.name} cache stores in its prologue (the fa_rope fusion)"
        if out_rot:
            where += f", its output rotated back in runs of {out_rot}"
        where += note
        cases.append((where + (" (the rule)" if on == rule else ""), pre_pass + rec.kernels))
    return cases


def decode_router(seq, m, norm: bool = False) -> None:
    """One token's router logits (F32 weights) with the routing in the mat-vec's last workgroup
    (`norm`: and the residual add and norm before it in its prologue)."""
    dev = seq.device
    w = placeholder(dev, F32, (m["hidden"], m["n_expert"]), "router weights")
    cur = placeholder(dev, F32, (m["hidden"], 1), "cur")
    logits = placeholder(dev, F32, (m["n_expert"], 1), "router")
    ids, wts = placeholder(dev, I32, (m["n_used"], 1), "ids"), placeholder(dev, F32, (m["n_used"], 1), "weights")
    route = route_epilogue(dev, w, logits, ids, wts, m["n_used"], True, placeholder(dev, I32, (1,), "counter"))
    if route is None:
        raise VkrtError("the GCN tuning cannot route in the router's mat-vec")
    norm_in = None
    if norm:
        x, pending = placeholder(dev, F32, (m["hidden"], 1), "x"), placeholder(dev, F32, (m["hidden"], 1), "pending")
        norm_in = norm_input(dev, x, pending, placeholder(dev, F32, (m["hidden"],), "w"), 1e-6, cur)
        if norm_in is None:
            raise VkrtError("the GCN tuning cannot norm in the router's mat-vec")
    matmul(seq, w, cur, logits, route=route, norm_in=norm_in)


def cases(dev, weights=MODEL["weights"]) -> list[tuple[str, list]]:
    """(where it is used, pipelines) for every kernel call of a prefill and a decode step, with
    matmul kernels for the weight types `weights`."""
    m, tune = MODEL, dev.tuning
    # activations: rows of 2048, 768 or 4096 floats at 16-byte aligned offsets, read as vec4
    xvec4 = all(vec4_ok(placeholder(dev, F32, (k, 1), "x"), 0, k)
                for k in (m["hidden"], m["ff_expert"], m["n_head"] * m["head"]))
    types = [kernel_type(name) for name in weights]
    out = []
    wide = gemm_tuning(tune, 1 << 30)   # the tile of many token columns (mm_big_*)
    for typ in types:
        out += [(f"prefill {typ.name}: attention projections", [gemm_kernel(dev, typ, wide, xvec4=xvec4)]),
                (f"short prompt / server step {typ.name}: GEMM", [gemm_kernel(dev, typ, tune, xvec4=xvec4)]),
                (f"short prompt / server step {typ.name}: GEMM split along K (tuning mm_split_*)",
                 [gemm_kernel(dev, typ, tune, xvec4=xvec4, split_k=True)]),
                (f"prefill {typ.name}: experts", [gemm_kernel(dev, typ, wide, xvec4=xvec4, mul_mat_id=True)]),
                (f"prefill {typ.name}: experts of few pairs", [gemm_kernel(dev, typ, tune, xvec4=xvec4,
                                                                            mul_mat_id=True)])]
    for hs in (m["head"], 256):
        out += flash_attn_cases(dev, hs, m["ubatch"], "prefill", both=(False, True))
    for typ in types:
        hidden, ff = m["hidden"], m["ff_expert"]
        cols = min(tune.mv_max_n, tune.mv_dense_max_n)
        wide = typ.name in MV_WIDE   # 16-byte loads, as matmul takes them for aligned weights
        out += [(f"decode {typ.name}: attention projections",
                 [mat_vec_kernel(dev, typ, 1, tune, k=hidden, m=hidden, xvec4=xvec4, wide=wide).kernel]),
                (f"decode {typ.name}: attention projections, {cols} slots (a server's step, a run of columns)",
                 [mat_vec_kernel(dev, typ, cols, tune, k=hidden, m=hidden, xvec4=xvec4, wide=wide).kernel]),
                (f"decode {typ.name}: attention output projection",
                 [mat_vec_kernel(dev, typ, 1, tune, k=m["n_head"] * m["head"], m=hidden, xvec4=xvec4, wide=wide).kernel]),
                (f"decode {typ.name}: expert gate and up in one pass (the gate_up fusion)",
                 [mat_vec_kernel(dev, typ, 1, tune, k=hidden, m=ff, layers=m["n_used"], xvec4=xvec4, wide=wide,
                                entry="mul_mv_id", gate_up="silu").kernel]),
                (f"decode {typ.name}: expert down summed into the residual stream, its last workgroup "
                 "doing the next RMS norm (the resid_norm fusion)",
                 [mat_vec_kernel(dev, typ, 1, tune, k=ff, m=hidden, xvec4=xvec4, wide=wide, entry="mul_mv_id_sum",
                                slots=m["n_used"]).kernel]),
                (f"decode {typ.name}: expert gate/up apart (VKRT_FUSE=all,-gate_up)",
                 [mat_vec_kernel(dev, typ, 1, tune, k=hidden, m=ff, layers=m["n_used"], xvec4=xvec4, wide=wide,
                                entry="mul_mv_id").kernel]),
                (f"decode {typ.name}: expert down apart (VKRT_FUSE=all,-resid_norm)",
                 [mat_vec_kernel(dev, typ, 1, tune, k=ff, m=hidden, layers=m["n_used"], xvec4=xvec4, wide=wide,
                                entry="mul_mv_id").kernel])]
    out += flash_attn_cases(dev, m["head"], 1, "decode")
    out += flash_attn_cases(dev, m["head"], 1, "decode", prologue=True)
    # (one query row a thread, with the prologue too: its 2 rows at head 128 take ACO to 92 VGPRs)
    shared_kv = replace(tune, fa_loads_first=3, fa_prologue_pack_rows_by_head=())
    for prologue in (False, True):
        out += flash_attn_cases(dev, m["head"], 1, "decode", prologue=prologue, tuning=shared_kv,
                                note=", the K/V tile in shared memory (fa_loads_first=3 "
                                     "fa_prologue_pack_rows_by_head=none; no table takes it)")
    # ops that build their pipeline while recording (the same for prefill and decode)
    T, E, D = m["ubatch"], m["hidden"], m["head"]
    x, cur, pending = (placeholder(dev, F32, (E, T), name) for name in ("x", "cur", "pending"))
    q, qr = (placeholder(dev, F32, (D, m["n_head"], T), name) for name in ("q", "qr"))
    pos = placeholder(dev, I32, (T,), "pos")
    router = placeholder(dev, F32, (m["n_expert"], T), "router")
    ids, weights = placeholder(dev, I32, (m["n_used"], T), "ids"), placeholder(dev, F32, (m["n_used"], T), "weights")
    w_head, w_hidden = placeholder(dev, F32, (D,), "w"), placeholder(dev, F32, (E,), "w")
    kv = m["n_head_kv"]
    k3 = placeholder(dev, F32, (D, kv, T), "k")
    cache = placeholder(dev, F16, (D, m["n_kv"], kv), "k cache")
    rope_args = dict(n_dims=D, freq_base=1e6, neox=True)
    out += [("q norm + rope (norm_rope)", recorded(dev, lambda seq: norm_rope(seq, q, pos, qr, weight=w_head,
                                                                             eps=1e-6, **rope_args))),
            ("k norm + rope + store into the F16 cache (norm_rope)",
             recorded(dev, lambda seq: norm_rope(seq, k3, pos, cache, weight=w_head, eps=1e-6, rows=pos,
                                                 **rope_args))),
            ("q and k norm + rope + K's store into the F16 cache in one dispatch (the qk_rope fusion)",
             recorded(dev, lambda seq: norm_rope(seq, k3, pos, cache, weight=w_head, eps=1e-6, rows=pos,
                                                 with_q=(q, qr, w_head), **rope_args))),
            ("q/k norm per head (VKRT_FUSE=all,-norm_rope)", recorded(dev, lambda seq: rms_norm(seq, q, q, 1e-6, w_head))),
            ("residual add + block norm", recorded(dev, lambda seq: rms_norm(seq, x, cur, 1e-6, w_hidden,
                                                                              residual=pending, sum_out=x))),
            ("rope (VKRT_FUSE=all,-norm_rope)", recorded(dev, lambda seq: rope(seq, q, pos, qr, **rope_args))),
            ("split-K GEMM: the partial tiles added (split_sum)",
             [kernel(dev, "split_sum", push=SPLIT_SUM_PUSH, workgroup=(tune.wg_size,))]),
            ("expert routing", recorded(dev, lambda seq: moe_route(seq, router, ids, weights, m["n_used"], True))),
            ("decode: router mat-vec routing in its last workgroup (the route fusion)",
             recorded(dev, lambda seq: decode_router(seq, m))),
            ("decode: router mat-vec with the residual add and norm before it (the norm_route fusion)",
             recorded(dev, lambda seq: decode_router(seq, m, norm=True))),
            ("experts' weighted sum + residual add + block norm (the combine_norm fusion)",
             recorded(dev, lambda seq: rms_norm(seq, x, cur, 1e-6, w_hidden, sum_out=x, residual=ExpertSum(
                 placeholder(dev, F32, (E, m["n_used"], T), "experts"), weights, pending)))),
            ("greedy sampling on the GPU (argmax of 151936 logits)",
             recorded(dev, lambda seq: argmax(seq, placeholder(dev, F32, (151936,), "logits"),
                                              placeholder(dev, I32, (2 * MAX_PARTS,), "partials"),
                                              placeholder(dev, I32, (1,), "token"))))]
    return out + qwen35_cases(dev)


def kv_cases(dev, kv_types) -> list[tuple[str, list]]:
    """Flash attention alone at head 64, 128 and 256, prefill and decode, K and V of each of
    `kv_types` (names as -ctk takes them); decode also with the fa_rope prologue."""
    out = []
    for name in kv_types:
        typ = kv_type(name)
        for hs in (64, 128, 256):
            for phase, n_q in (("prefill", MODEL["ubatch"]), ("decode", 1)):
                out += flash_attn_cases(dev, hs, n_q, phase, note=f", K/V {typ.name}", cache_type=typ)
            out += flash_attn_cases(dev, hs, 1, "decode", prologue=True, note=f", K/V {typ.name}", cache_type=typ)
    return out


def qwen35_cases(dev) -> list[tuple[str, list]]:
    """The kernels Qwen3.5-35B-A3B's DeltaNet and gated attention layers add."""
    q35, T = QWEN35, MODEL["ubatch"]
    D, Hk, Hv, K = q35["ssm_head"], q35["k_heads"], q35["v_heads"], q35["conv"]
    C = (2 * Hk + Hv) * D
    qkv, conv = placeholder(dev, F32, (C, T), "qkv"), placeholder(dev, F32, (C, T), "conv")
    w_conv = placeholder(dev, F32, (K, C), "ssm_conv1d")
    conv_state = placeholder(dev, F32, (C, K - 1, 4), "conv state")
    ssm_state = placeholder(dev, F32, (D, D, Hv, 4), "ssm state")
    alpha, beta = placeholder(dev, F32, (Hv, T), "alpha"), placeholder(dev, F32, (Hv, T), "beta")
    dt, a = placeholder(dev, F32, (Hv,), "ssm_dt"), placeholder(dev, F32, (Hv,), "ssm_a")
    out, z = placeholder(dev, F32, (Hv * D, T), "out"), placeholder(dev, F32, (Hv * D, T), "z")
    slots, w_norm = placeholder(dev, I32, (1,), "slots"), placeholder(dev, F32, (D,), "ssm_norm")
    work = placeholder(dev, F32, (delta_net_workspace_bytes(dev, Hv, D, T) // 4,), "workspace")
    dn = dict(n_k_heads=Hk, n_v_heads=Hv, head_dim=D, eps=1e-6)

    span = placeholder(dev, I32, (3,), "catch-up span")
    snap_ssm = placeholder(dev, F32, (D, D, Hv), "snapshot state")
    taps = placeholder(dev, F32, (C, K - 1, 30), "windows")

    def rule(n):   # the delta rule over n tokens of one sequence, in the form the tuning picks
        return lambda seq: delta_net(seq, qkv.slice(1, 0, n), alpha.slice(1, 0, n), beta.slice(1, 0, n), dt, a,
                                     ssm_state, slots, out.slice(1, 0, n), n_seqs=1, workspace=work, **dn)
    H, hs = q35["n_head"], q35["head"]
    q = placeholder(dev, F32, (2 * hs * H, T), "q and gate")
    q3 = q.view((hs, H, T), nb=(4, 8 * hs, 8 * hs * H))
    gate = q.view((hs, H, T), nb=(4, 8 * hs, 8 * hs * H), offset=4 * hs)
    qr, att = placeholder(dev, F32, (hs, H, T), "qr"), placeholder(dev, F32, (hs, H, T), "attn")
    pos, w_head = placeholder(dev, I32, (4 * T,), "pos"), placeholder(dev, F32, (hs,), "w")
    rope_args = dict(n_dims=q35["rope_dims"], freq_base=1e7, neox=True, sections=q35["sections"], interleaved=True)
    return [
        ("qwen35 DeltaNet: conv with state (prefill)", recorded(dev, lambda seq: ssm_conv(
            seq, qkv, w_conv, conv_state, slots, conv, n_seqs=1))),
        ("qwen35 DeltaNet: delta rule, decode (recurrent)", recorded(dev, rule(1))),
        (f"qwen35 DeltaNet: delta rule, prefill of {T} (chunked)", recorded(dev, rule(T))),
        ("qwen35 DeltaNet: speculative catch-up's delta rule (span, from the snapshot)", recorded(dev, lambda seq: delta_net(
            seq, qkv.slice(1, 0, 16), alpha.slice(1, 0, 16), beta.slice(1, 0, 16), dt, a, ssm_state, span,
            out.slice(1, 0, 16), n_seqs=1, span=True, state_in=snap_ssm, **dn))),
        ("qwen35 DeltaNet: speculative catch-up's conv windows", recorded(dev, lambda seq: catch_up_windows(
            seq, taps, placeholder(dev, F32, (C, K - 1, 30), "snapshot taps"), qkv.view((C, 16, 30), nb=(4, 4 * C, 64 * C)),
            span))),
        ("qwen35 DeltaNet: gated norm (rms_norm * silu(z))", recorded(dev, lambda seq: rms_norm(
            seq, out.view((D, Hv, T)), out.view((D, Hv, T)), 1e-6, w_norm, gate=z.view((D, Hv, T))))),
        ("qwen35 attention: q norm + IMROPE (norm_rope, head 256)", recorded(dev, lambda seq: norm_rope(
            seq, q3, pos, qr, weight=w_head, eps=1e-6, **rope_args))),
        ("qwen35 attention: sigmoid output gate", recorded(dev, lambda seq: gate_mul(seq, att, gate, att)))]


def variant(kern) -> str:
    """The defines (QTYPE_X as X) and the workgroup size."""
    parts = [k[6:] if k.startswith("QTYPE_") else f"{k}={v}" for k, v in kern.defines.items()]
    return " ".join(parts + [f"wg {'x'.join(str(s) for s in kern.workgroup if s > 1) or 1}"])


def loops_of(kern) -> tuple[dict | None, list[dict]]:
    """The main loop's counts and every loop's (isa_loop.loop_counts, loops) from the driver's
    "Assembly" (RADV); (None, []) where the driver gives none."""
    asm = pipeline_representations(kern).get("Assembly")
    return (loop_counts(asm), loops(asm)) if asm else (None, [])


def collect(dev, weights=MODEL["weights"], kv_types=None) -> list[dict]:
    """One row per distinct pipeline, in order of first use, with every statistic (`kv_types`:
    only the flash attention of kv_cases); with a device capturing disassembly, its main loop."""
    rows: dict[int, dict] = {}
    for where, kernels in (kv_cases(dev, kv_types) if kv_types else cases(dev, weights)):
        for kern in kernels:
            row = rows.get(id(kern))
            if row is None:
                row = rows[id(kern)] = dict(kernel=kern.shader, variant=variant(kern), defines=kern.defines,
                                            workgroup=list(kern.workgroup), used_by=[],
                                            statistics=pipeline_statistics(kern))
                if dev.capture_disassembly:
                    row["loop"], row["loops"] = loops_of(kern)
            if where not in row["used_by"]:
                row["used_by"].append(where)
    return list(rows.values())


def open_device(any_device: bool = False, disassembly: bool = False) -> Device:
    """The GCN device (`any_device`: the first device, whatever it is) with statistics capture
    (and `disassembly`: the compiler's representations) and no queues, or SystemExit saying why not."""
    try:
        dev = Device(capture_statistics=True, capture_disassembly=disassembly, queues=False)
    except VkrtError as exc:
        raise SystemExit(f"gcn_shader_stats: {exc} ({ENV_HINT})") from None
    p = dev.profile
    if any_device:
        return dev
    if p.detected_architecture is not Arch.AMD_GCN:
        dev.close()
        raise SystemExit(f"gcn_shader_stats: {p.name} is {p.detected_architecture.value}, not a GCN GPU ({ENV_HINT})")
    if p.architecture is not Arch.AMD_GCN:
        dev.close()
        raise SystemExit(f"gcn_shader_stats: VKRT_ARCH gives {p.name} the {p.architecture.value} tuning; unset it")
    return dev


def print_table(result: dict) -> None:
    t = result["tuning"]
    print(f"{result['device']} ({result['driver']}), {result['architecture']} tuning: GEMM tile "
          f"{t['mm_bm']}x{t['mm_bn']}x{t['mm_bk']} ({t['mm_tm']}x{t['mm_tn']} a thread; "
          f"{t['mm_big_bm']}x{t['mm_big_bn']} past {t['mm_bn']} columns), mat-vec wg {t['mv_wg']} "
          f"x {t['mv_rows']} rows, flash attention wg {t['fa_wg']}"
          + (f"; tuning overrides VKRT_TUNE={result['tune']!r}" if result["tune"] else ""))
    if result["kernels"] and "VGPRs" not in result["kernels"][0]["statistics"]:   # not RADV: the driver's names
        names = list(dict.fromkeys(n for r in result["kernels"] for n in r["statistics"]))
        print("| " + " | ".join(["kernel", "variant", "used by", *names]) + " |")
        print("|" + "|".join("---" for _ in range(3 + len(names))) + "|")
        for r in result["kernels"]:
            cells = [r["kernel"], r["variant"], "; ".join(r["used_by"]), *(r["statistics"].get(n, "?") for n in names)]
            print("| " + " | ".join(str(c) for c in cells) + " |")
        return
    loops = any("loop" in r for r in result["kernels"])
    columns = ["kernel", "variant", "used by", "VGPRs", "SGPRs", "spills S/V", "LDS bytes", "waves/SIMD",
               "instructions", "code bytes"] + (["loop: instructions / VALU / FMA / cvt / mov"] if loops else [])
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for r in result["kernels"]:
        s = r["statistics"]
        cells = [r["kernel"], r["variant"], "; ".join(r["used_by"]), s.get("VGPRs", "?"), s.get("SGPRs", "?"),
                 f"{s.get('Spilled SGPRs', '?')}/{s.get('Spilled VGPRs', '?')}", s.get("LDS size", "?"),
                 s.get("Subgroups per SIMD", "?"), s.get("Instructions", "?"), s.get("Code size", "?")]
        if loops:
            lp = r.get("loop")
            cells.append(" / ".join(str(lp[k]) for k in ("instructions", "valu", "fma", "cvt", "mov")) if lp else "-")
        print("| " + " | ".join(str(c) for c in cells) + " |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--weights", default=",".join(MODEL["weights"]),
                    help="comma-separated weight types of the matmul kernels, or `all`")
    ap.add_argument("--kv", metavar="TYPES",
                    help="only flash attention at head 64/128/256, prefill and decode, with K and V of each of these "
                         "comma-separated KV cache types (f16,q8_0,...; `all`: every one)")
    ap.add_argument("--any-device", action="store_true",
                    help="the first device whatever it is, with its own table's kernels and the statistics its "
                         "driver names (NVIDIA: Register Count; 65536 a SM over registers x invocations bounds "
                         "the workgroups an SM holds)")
    ap.add_argument("--loop", action="store_true",
                    help="also each kernel's main loop from the compiler's assembly: instructions, VALU, "
                         "multiply-adds, conversions, moves (bench/isa_loop.py; RADV)")
    args = ap.parse_args(argv)
    kv_types = None
    if args.kv:
        kv_types = [t.lower() for t in KV_TYPES] if args.kv == "all" else [t.strip() for t in args.kv.split(",")]
        try:
            for t in kv_types:
                kv_type(t)
        except VkrtError as exc:
            raise SystemExit(f"gcn_shader_stats: {exc}") from None
    weights = ([t.name for t in supported_types()] if args.weights == "all"
               else [w.strip().upper() for w in args.weights.split(",") if w.strip()])
    with open_device(args.any_device, args.loop) as dev:
        p = dev.profile
        fields = ("mm_bm", "mm_bn", "mm_bk", "mm_tm", "mm_tn", "mm_big_bm", "mm_big_bn", "mv_wg", "mv_rows", "fa_wg")
        try:
            kernels = collect(dev, weights, kv_types)
        except VkrtError as exc:   # a table this device cannot build (VKRT_ARCH naming another GPU's)
            raise SystemExit(f"gcn_shader_stats: {p.name} with the {dev.tuning.arch.value} table: {exc}") from None
        result = dict(device=p.name, driver=p.driver_info or p.driver_name, architecture=p.architecture.value,
                      tune=dev.identity().get("tune", ""), model={**MODEL, "weights": weights},
                      tuning={f: getattr(dev.tuning, f) for f in fields}, kernels=kernels)
        dev.check_validation()  # with VKRT_VALIDATE=1: the layer's errors fail the run
    if args.json:
        json.dump(result, sys.stdout)
        print()
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
