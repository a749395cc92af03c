"""Flash-attention decode: the query heads of a KV head packed into one workgroup and the live
cells read from a buffer, against one head a workgroup over the cells padded to the engine's
256-cell bucket (the path before both), plus a split-K sweep of the packed kernel.

    python bench/flash_attn_decode.py [--queries 1,16] [--depth 100,1000,4000,16000]
                                      [--heads 128:32:4,256:16:2] [--splits 1,2,4,8,16,32]
                                      [--kv f16,q8_0,...] [--repeats 5] [--set FIELD=VALUE ...]
                                      [--cold MIB] [--quick] [--json]

Each of `queries` query rows (one token of as many sequences) sees the first depth + 1 cells of
a KV cache covering them rounded up to 256 (the rest masked), K/V of each --kv type (f16 as the
engine's default; a quantised type's blocks random codes under random fp16 scales). Times
are GPU medians (timestamps) of the attention (splits merged inside it), after a warm-up (--cold:
each run after an untimed write of that many MiB, so K and V come from memory as in a model's
decode step rather than from the cache the last run left them in); `speedup`
is the unpacked padded time over the packed one with the split FlashAttn picks by itself
(VKRT_ARCH=gcn gives the GCN table); `speedup_vs_loads_where_used` is the packed kernel with
each K, V and mask value loaded where it is used (tuning fa_loads_first=0) over the table's;
`us_mask_zero` (one query) the packed kernel in a step flagged mask-zero, as one sequence's decode
step runs it (the mask is 0 on the live cells; the kernel reads none of it) and
`speedup_mask_zero` the packed time over it; `us_with_prologue` (one query) the flagged kernel
doing norm_rope's work in its prologue as a decode step's attention does (VKRT_FUSE's fa_rope: the q/k norm, RoPE, and the new cell's K and V
stored, rotated and quantised for a quantised cache; None where it is turned down, and
`prologue_refused` says why: the tuning's fa_prologue_max_head, say) and `prologue_cost` that
over the flagged time; `us_without_flash` the attention without flash
attention (`-fa 0`: QK^T, softmax, PV; F16/F32 caches) and `speedup_vs_without_flash` that over
the packed time. The sweep rows force the packed kernel's split count.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np
from common import bench_settings
from flash_attn import cache, parse_args, time_runs

from vkrt.commands import tensor_from_numpy
from vkrt.device import Device
from vkrt.engine.step_inputs import KV_STEP
from vkrt.errors import VkrtError
from vkrt.memory import F32, Tensor, ggml_type
from vkrt.ops.kv_quant import kv_type
from vkrt.ops.fa_norm_rope import fa_norm_rope
from vkrt.ops.attention import Attention
from vkrt.ops.flash_attn import FlashAttn
from vkrt.ops.flash_work import FlashWork
from vkrt.ops.hadamard import k_rotation, v_rotation

QUICK = dict(queries="1,4", depth="100,600", heads="64:4:1,128:4:2", splits="1,2,4", repeats=2)


def measure(dev, n_q: int, depth: int, hs: int, n_head: int, n_head_kv: int, splits, repeats: int, rng,
            kv=ggml_type("F16"), cold: int = 0) -> dict:
    used = depth + 1
    n_kv = -(-used // KV_STEP) * KV_STEP
    q = rng.standard_normal((1, n_head, n_q, hs), dtype=np.float32)
    mask = np.zeros((1, 1, n_q, n_kv), np.float16)
    mask[..., used:] = -np.inf
    tensors = [tensor_from_numpy(dev, q), cache(dev, (1, n_head_kv, n_kv, hs), kv, rng),
               cache(dev, (1, n_head_kv, n_kv, hs), kv, rng),
               *(tensor_from_numpy(dev, a) for a in (mask, np.array([used], np.int32)))]
    variants = [("unpacked, padded", dict(gqa_pack=False)), ("packed, live cells", dict(kv_used=tensors[4])),
                ("packed, loads where used", dict(kv_used=tensors[4], tuning=replace(dev.tuning, fa_loads_first=0)))]
    variants += [(f"packed, split {n}", dict(kv_used=tensors[4], split_k=n)) for n in splits]
    outs, ops, work = [], [], FlashWork(dev)   # the ops run one at a time, as a model's layers
    # one sequence's decode: the step flags its mask all zero on the live cells
    flag = tensor_from_numpy(dev, np.array([1], np.int32)) if n_q == 1 else None
    if flag is not None:
        variants.append((MASK_ZERO, dict(kv_used=tensors[4], mask_zero=flag)))
    pro_tensors = prologue_operands(dev, n_q, depth, hs, n_head, n_head_kv, rng)
    if pro_tensors:   # last: the new cell's store changes the caches
        pro = fa_norm_rope(dev, *pro_tensors[:5], tensors[1], tensors[2], q_weight=pro_tensors[5],
                           k_weight=pro_tensors[5], eps=1e-6, rope_args=dict(n_dims=hs, freq_base=1e6, neox=True),
                           **rotations(kv, hs))
        if pro is not None:
            variants.append((PROLOGUE, dict(kv_used=tensors[4], prologue=pro, out_rot=rotations(kv, hs)["v_rot"],
                                            mask_zero=flag)))
    # why the prologue was not timed (None: it was)
    refused = ("more than one query token" if not pro_tensors else
               f"no prologue for a {kv.name} cache (norm_rope stores it)" if pro is None else None)
    plain = None   # the attention without flash (it reads F16/F32 caches only)
    scores = Tensor.empty(dev, F32, (n_kv * n_q * n_head,)) if not kv.quantized else None
    try:
        if scores is not None:
            outs.append(Tensor.empty(dev, F32, (hs, n_head, n_q, 1)))
            plain = Attention(dev, *tensors[:3], outs[-1], tensors[3], scores=scores, scale=hs ** -0.5, label=NO_FLASH)
        for name, kw in variants:
            outs.append(Tensor.empty(dev, F32, (hs, n_head, n_q, 1)))
            op = FlashAttn(dev, *tensors[:3], outs[-1], tensors[3], scale=hs ** -0.5, label=name, work=work, **kw)
            if "split_k" in kw and any(o.n_split == op.n_split for o in ops[3:]):   # clamped to the tiles
                continue
            if "prologue" in kw and op.prologue is None:
                refused = op.prologue_blocker(kw["prologue"], tensors[1], tensors[2], 0.0)
                continue
            ops.append(op)
        timed = ops + ([plain] if plain else [])
        times = [t for t, _ in time_runs(dev, timed, repeats, cold)]
        rows = [dict(variant=op.label, pack=op.pack, n_split=op.n_split, us=t * 1e6) for op, t in zip(ops, times)]
        without = times[-1] * 1e6 if plain else None
    finally:
        for x in (work, scores, flag, *tensors, *outs, *pro_tensors):
            if x is not None:
                x.close()
    with_prologue = next((r["us"] for r in rows if r["variant"] == PROLOGUE), None)
    mask_zero = next((r["us"] for r in rows if r["variant"] == MASK_ZERO), None)
    rows = [r for r in rows if r["variant"] not in (PROLOGUE, MASK_ZERO)]
    times = [r["us"] / 1e6 for r in rows]
    return dict(queries=n_q, depth=depth, n_kv=n_kv, kv=kv.name.lower(), head_size=hs, n_head=n_head,
                n_head_kv=n_head_kv,
                us_unpacked=times[0] * 1e6, us_packed=times[1] * 1e6, speedup=times[0] / times[1],
                us_loads_where_used=times[2] * 1e6, speedup_vs_loads_where_used=times[2] / times[1],
                best_split=min(rows[3:], key=lambda r: r["us"])["n_split"] if rows[3:] else None,
                us_mask_zero=mask_zero, speedup_mask_zero=times[1] * 1e6 / mask_zero if mask_zero else None,
                us_with_prologue=with_prologue, us_without_flash=without,
                speedup_vs_without_flash=without / (times[1] * 1e6) if without else None,
                prologue_cost=with_prologue / mask_zero if with_prologue else None,
                prologue_refused=refused, variants=rows)


PROLOGUE = "packed, norm_rope in its prologue"
MASK_ZERO = "packed, mask flagged zero"
NO_FLASH = "attention without flash (-fa 0)"


def rotations(kv, hs: int) -> dict:
    """The engine's rotation of a cache of type kv (quantised ones only) at head size hs."""
    return dict(k_rot=k_rotation(hs), v_rot=v_rotation(hs)) if kv.quantized else dict(k_rot=0, v_rot=0)


def prologue_operands(dev, n_q: int, depth: int, hs: int, n_head: int, n_head_kv: int, rng) -> list:
    """One token's projected q, k, v (F32 [hs, heads, 1]), its position and cell (depth) and a norm
    weight: what the fa_rope prologue reads ([] past one query)."""
    if n_q != 1:
        return []
    raw = [rng.standard_normal((1, h, hs), dtype=np.float32) for h in (n_head, n_head_kv, n_head_kv)]
    return [tensor_from_numpy(dev, a) for a in (*raw, np.array([depth], np.int32), np.array([depth], np.int32),
                                                rng.uniform(0.5, 1.5, hs).astype(np.float32))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", default="1,16", help="query rows (sequences decoding), comma-separated")
    ap.add_argument("--depth", default="100,1000,4000,16000", help="cached tokens before the query")
    ap.add_argument("--splits", default="1,2,4,8,16,32", help="split counts the packed sweep forces ('': none)")
    ap.add_argument("--kv", default="f16", help="K/V cache types, comma-separated (f16, q8_0, q4_0, ...)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a tuning field (repeatable), e.g. fa_pack_rows=2")
    args = parse_args(ap, QUICK, repeats=5)
    ints = lambda text: [int(x) for x in text.split(",") if x]   # noqa: E731
    heads = args.heads
    try:
        kv_types = [kv_type(name.strip()) for name in args.kv.split(",")]
    except VkrtError as exc:
        raise SystemExit(f"flash_attn_decode: {exc}") from None
    rng = np.random.default_rng(0)
    with Device(settings=bench_settings(args.set)) as dev:
        rows = [measure(dev, nq, depth, hs, nh, nkv, ints(args.splits), args.repeats, rng, kv, args.cold)
                for kv in kv_types for hs, nh, nkv in heads for nq in ints(args.queries) for depth in ints(args.depth)]
        result = dict(**dev.identity(), cold_mib=args.cold, rows=rows)
    if args.json:
        print(json.dumps(result))
        return
    tune = f", VKRT_TUNE {result['tune']!r}" if "tune" in result else ""
    print(f"flash attention decode on {result['device']} ({result['architecture']}{tune}), us per call")
    columns = ["K/V", "head", "heads", "queries", "depth", "cells", "unpacked padded", "packed live", "speedup",
               "loads where used (speedup)", "mask flagged zero (speedup)", "with the fa_rope prologue (cost)",
               "without flash (speedup)",
               "packed split sweep (splits: us)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for r in rows:
        sweep = ", ".join(f"{v['n_split']}: {v['us']:.1f}" for v in r["variants"][3:])
        auto = r["variants"][1]["n_split"]
        pro = (f"{r['us_with_prologue']:.1f} ({r['prologue_cost']:.2f}x)" if r["us_with_prologue"]
               else f"– ({r['prologue_refused']})" if r["prologue_refused"] else "–")
        mz = f"{r['us_mask_zero']:.1f} ({r['speedup_mask_zero']:.2f}x)" if r["us_mask_zero"] else "–"
        nf = f"{r['us_without_flash']:.1f} ({r['speedup_vs_without_flash']:.2f}x)" if r["us_without_flash"] else "–"
        print(f"| {r['kv']} | {r['head_size']} | {r['n_head']}/{r['n_head_kv']} | {r['queries']} | {r['depth']} "
              f"| {r['n_kv']} "
              f"| {r['us_unpacked']:.1f} | {r['us_packed']:.1f} (split {auto}) | {r['speedup']:.2f}x "
              f"| {r['us_loads_where_used']:.1f} ({r['speedup_vs_loads_where_used']:.2f}x) "
              f"| {mz} | {pro} | {nf} | {sweep} |")


if __name__ == "__main__":
    main()
