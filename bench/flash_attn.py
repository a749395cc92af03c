"""Flash-attention prefill with mask_opt on and off: GPU time (timestamps) and GFLOP/s.

    python bench/flash_attn.py [--ubatch 512,2048] [--depth 0,4096,16384,32768]
                               [--heads 128:32:4,256:16:2] [--kv f16,q8_0,...] [--repeats 3] [--cold MIB]
                               [--quick] [--json]

A ubatch of `ubatch` queries after `depth` cached tokens attends causally to depth + ubatch keys
(K, V of each --kv type, f16 by default as the engine's; mask f16), as in llama.cpp's prefill.
--heads lists head_size:n_head:n_head_kv (default: Qwen3-30B-A3B-like 128 and Qwen3.5-35B-A3B-like
256). Each shape runs with mask_opt forced off and on; times are medians of --repeats runs after a
warm-up, and include the mask_opt pre-pass (--cold: each run after an untimed write of that many
MiB, so K and V come from memory, as between a model's layers). GFLOP/s count every key, masked or not
(2 * n_q * n_kv * (hsk + hsv) * n_head), so mask_opt's skipped blocks show up as a higher rate.
"rule" is what FlashAttn picks by itself on this device (VKRT_ARCH=gcn gives the GCN rule), and
`gflops` the rate with that choice.
Where the device runs prompt attention on cooperative matrices (tuning.fa_coopmat), the scalar
fp32 kernel runs beside it (its own mask_opt rule): `speedup_vs_scalar`.
--quick shrinks everything for lavapipe.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from common import warm_up

from vkrt.commands import CommandSequence, tensor_from_numpy, write_tensor
from vkrt.device import Device
from vkrt.device.tuning import fa_mask_opt_rule
from vkrt.errors import VkrtError
from vkrt.memory import F32, Tensor, ggml_type
from vkrt.ops.flash_attn import FlashAttn
from vkrt.ops.flash_work import FlashWork
from vkrt.ops.kv_quant import kv_type

QUICK = dict(ubatch="64,256", depth="0,512,2048", heads="128:4:2,256:2:1", repeats=2)


def cache(dev, shape: tuple, typ, rng) -> Tensor:
    """A K or V cache (batch, heads, cells, head size) of `typ`: normal values for f16/f32; for a
    quantised type random bytes whose fp16 fields (the first 2, or 4 for Q4_1/Q5_1) are scales
    of about 1/16 (timing only: the values are not a quantisation of anything)."""
    if not typ.quantized:
        return tensor_from_numpy(dev, rng.standard_normal(shape, dtype=np.float32).astype(typ.dtype))
    blocks = rng.integers(0, 256, (int(np.prod(shape)) // typ.block_size, typ.type_size), dtype=np.uint8)
    halves = 2 if typ.name in ("Q4_1", "Q5_1") else 1
    blocks[:, :2 * halves] = (rng.uniform(0.03, 0.1, (len(blocks), halves)).astype(np.float16)
                              .view(np.uint8).reshape(len(blocks), -1))
    t = Tensor.empty(dev, typ, tuple(reversed(shape)))
    write_tensor(t, blocks)
    return t


def causal_mask(n_q: int, n_kv: int) -> np.ndarray:
    keys = np.arange(n_kv, dtype=np.int64)[None, :]
    pos = (n_kv - n_q + np.arange(n_q, dtype=np.int64))[:, None]
    return np.where(keys <= pos, np.float16(0), np.float16(-np.inf))[None, None]


def time_runs(dev, ops: list, repeats: int, cold: int = 0) -> list[tuple[float, float]]:
    """(median GPU seconds of the whole op, median of its mask_opt pre-pass) for each op (a
    FlashAttn or an Attention: anything with `label` and `record(seq)`); the ops
    run in turn, `repeats` rounds after a warm-up (common.warm_up: the GPU at its working clock),
    so drifting clocks or load hit them alike. `cold` (MiB): each run first overwrites a buffer
    that large (untimed), so the op reads its K and V from memory as a model's layer does, not
    from a cache the last run left them in."""
    flush = Tensor.empty(dev, F32, (cold << 18,)) if cold else None
    seqs = [CommandSequence(dev, timestamps=True, label=f"bench {fa.label}") for fa in ops]
    try:
        for fa, seq in zip(ops, seqs):
            with seq.record():
                if flush is not None:
                    seq.fill(flush.range(), label=FLUSH)
                    seq.barrier()
                fa.record(seq)
        warm_up(*(seq.run for seq in seqs))
        samples = [([], []) for _ in ops]
        for _ in range(repeats):
            for seq, (total, prepass) in zip(seqs, samples):
                seq.run()
                times = seq.gpu_times()
                total.append(sum(t for label, t in times if label != FLUSH))
                prepass.append(sum(t for label, t in times if label.endswith("mask_opt")))
        return [(statistics.median(total), statistics.median(prepass)) for total, prepass in samples]
    finally:
        for seq in seqs:
            seq.close()
        if flush is not None:
            flush.close()


FLUSH = "cache flush"


def measure(dev, ubatch: int, depth: int, hs: int, n_head: int, n_head_kv: int, repeats: int, rng,
            cold: int = 0, kv=None) -> dict:
    n_kv = depth + ubatch
    kv = kv or ggml_type("F16")
    q = rng.standard_normal((1, n_head, ubatch, hs), dtype=np.float32)
    tensors = [tensor_from_numpy(dev, q), cache(dev, (1, n_head_kv, n_kv, hs), kv, rng),
               cache(dev, (1, n_head_kv, n_kv, hs), kv, rng), tensor_from_numpy(dev, causal_mask(ubatch, n_kv))]
    outs = [Tensor.empty(dev, F32, (hs, n_head, ubatch, 1)) for _ in range(2)]
    ops, work = [], FlashWork(dev)   # the ops run one at a time, as a model's layers
    try:
        for on, out in zip((False, True), outs):
            ops.append(FlashAttn(dev, *tensors[:3], out, tensors[3], scale=hs ** -0.5, mask_opt=on, work=work,
                                 label=f"flash_attn mask_opt {'on' if on else 'off'}"))
        fa = ops[1]
        rule = fa_mask_opt_rule(dev.tuning, has_mask=True, nem0=n_kv, nem1=ubatch, hsk=hs, hsv=hs, bc=fa.tile.bc)
        if fa.coopmat:   # the scalar fp32 kernel beside it, with its own mask_opt rule
            outs.append(Tensor.empty(dev, F32, (hs, n_head, ubatch, 1)))
            ops.append(FlashAttn(dev, *tensors[:3], outs[-1], tensors[3], scale=hs ** -0.5, work=work, coopmat=False,
                                 label="flash_attn scalar"))
        times = time_runs(dev, ops, repeats, cold)
        (off_s, _), (on_s, prepass) = times[:2]
        scalar_s = times[2][0] if fa.coopmat else None
    finally:
        for x in (work, *tensors, *outs):
            x.close()
    flops = fa.shape.flops()
    chosen = on_s if rule else off_s
    tile = f"{fa.tile.br}x{fa.tile.bc} wg{fa.tile.wg}" + (" coopmat" if fa.coopmat else f" ds{fa.tile.d_split}")
    return dict(ubatch=ubatch, depth=depth, n_kv=n_kv, kv=kv.name.lower(), head_size=hs, n_head=n_head,
                n_head_kv=n_head_kv,
                tile=tile, coopmat=fa.coopmat, n_split=fa.n_split, rule=rule,
                ms_off=off_s * 1e3, ms_on=on_s * 1e3, prepass_ms=prepass * 1e3, gflops_off=flops / off_s / 1e9,
                gflops_on=flops / on_s / 1e9, gflops=flops / chosen / 1e9, speedup_mask_opt=off_s / on_s,
                ms_scalar=scalar_s * 1e3 if scalar_s else None,
                speedup_vs_scalar=scalar_s / chosen if scalar_s else None)


def parse_args(ap, quick: dict, repeats: int):
    """Add --heads, --repeats, --quick and --json to `ap` and parse; --quick sets the `quick`
    values, and heads becomes a list of (head_size, n_head, n_head_kv)."""
    ap.add_argument("--heads", default="128:32:4,256:16:2", help="head_size:n_head:n_head_kv, comma-separated")
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--quick", action="store_true", help=f"lavapipe-sized: {quick}")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--cold", type=int, default=0, metavar="MIB",
                    help="overwrite a buffer of MIB MiB before each timed run (untimed), so K and V come from "
                         "memory as in a model, not from the GPU's cache (e.g. 256; default 0: off)")
    args = ap.parse_args()
    if args.quick:
        for key, value in quick.items():
            setattr(args, key, value)
    args.heads = [tuple(int(y) for y in x.split(":")) for x in args.heads.split(",")]
    return args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ubatch", default="512,2048", help="query counts, comma-separated")
    ap.add_argument("--depth", default="0,4096,16384,32768", help="cached tokens before the ubatch")
    ap.add_argument("--kv", default="f16", help="K/V cache types, comma-separated (f16, q8_0, q4_0, ...)")
    args = parse_args(ap, QUICK, repeats=3)
    try:
        kv_types = [kv_type(name.strip()) for name in args.kv.split(",")]
    except VkrtError as exc:
        raise SystemExit(f"flash_attn: {exc}") from None
    ubatches = [int(x) for x in args.ubatch.split(",")]
    depths = [int(x) for x in args.depth.split(",")]
    heads = args.heads
    rng = np.random.default_rng(0)
    with Device() as dev:
        rows = [measure(dev, ub, depth, hs, nh, nkv, args.repeats, rng, args.cold, kv)
                for kv in kv_types for hs, nh, nkv in heads for ub in ubatches for depth in depths]
        result = dict(**dev.identity(), rows=rows)
    if args.json:
        print(json.dumps(result))
        return
    print(f"flash attention prefill on {result['device']} ({result['architecture']}), causal")
    columns = ["K/V", "head", "heads", "ubatch", "depth", "tile", "split", "rule", "off ms", "on ms", "pre-pass ms",
               "off GFLOP/s", "on GFLOP/s", "mask_opt", "scalar kernel ms (speedup)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for r in rows:
        print(f"| {r['kv']} | {r['head_size']} | {r['n_head']}/{r['n_head_kv']} | {r['ubatch']} | {r['depth']} | {r['tile']} "
              f"| {r['n_split']} | {'on' if r['rule'] else 'off'} | {r['ms_off']:.2f} | {r['ms_on']:.2f} "
              f"| {r['prepass_ms']:.3f} | {r['gflops_off']:.1f} | {r['gflops_on']:.1f} "
              f"| {100 * (r['speedup_mask_opt'] - 1):+.1f}% "
              + (f"| {r['ms_scalar']:.2f} ({r['speedup_vs_scalar']:.2f}x) |" if r["coopmat"] else "| - |"))
    fork = {16384: 8, 32768: 12}
    points = [r for r in rows
              if r["kv"] == "f16" and r["head_size"] == 256 and r["ubatch"] == 2048 and r["depth"] in fork]
    for r in points:
        print(f"head 256, ubatch 2048, depth {r['depth']}: mask_opt {100 * (r['speedup_mask_opt'] - 1):+.1f}% on "
              f"attention alone (the fork: +{fork[r['depth']]}% on a whole pp2048 run, RX 580)")


if __name__ == "__main__":
    main()
