"""Quantised matmul throughput: GFLOP/s and achieved GB/s of weight reads.

    python bench/matmul.py [--types Q4_K,Q6_K,Q8_0,Q4_1] [--n 1,512,2048] [--shapes dense,moe]
                           [--dense 4096x4096] [--moe 2048x768x128x8] [--reps 5]
                           [--set mv_rows=4 ...] [--peak-gbs 4800] [--json]

dense: W of M rows x K columns (a 3B model's 4096x4096 projection), y = W·x for n tokens.
--rotate-mib: the dense case cycles through distinct copies of the weight until they add up to
this many MiB (default 512, above any GPU's L2), so a mat-vec reads DRAM, not cache.
moe: one expert tensor K x M x n_expert with n_used experts per token (Qwen3-30B-A3B's 2048x768,
128 experts, 8 used), routing drawn uniformly in up to 16 rounds of experts the rounds before did
not choose, chained as a decode step's dispatches (one round replayed alone read its experts from
the L2); weight bytes count each expert a round used once.
GPU time from timestamps, median of --reps replays of one recorded command buffer, after 2 s of
replays (an H200 left idle between short bursts ran at a quarter of its clock: 4096x14336 Q4_0
read 26 or 108-133 us from one process to the next with 0.2 s). Peers in the same run: a compute
shader streaming --peer-mib of memory (vkrt/ops/stream_read.py: what the device's DRAM gives a
shader, `of_read`), the same probe reading each dense weight copy in turn, a dispatch of the
weight's size after a barrier as a dependent mat-vec is (`of_read_at_size`: a small matrix
cannot reach a long stream's rate, ramp-up and tail weigh more) and a buffer copy of the dense weight's size (read + write, `of_copy`; on the
H200 vkCmdCopyBuffer moves ~850 GB/s where a shader reads 4.5 TB/s); --peak-gbs adds the
fraction of a datasheet bandwidth (e.g. 4800 for an H200).
--overlap gives each copy its own output: no barrier between the copies' dispatches, so the figure
is the kernel's streaming rate rather than a dependent dispatch's time (decode's case).
--set overrides tuning fields (name=value) to try tiles without editing the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np
from common import bench_settings, warm_up

from vkrt.commands import CommandSequence, tensor_from_numpy, write_tensor
from vkrt.device import Device
from vkrt.memory import Buffer, Tensor, ggml_type
from vkrt.ops.flash_work import FlashWork
from vkrt.ops.matmul import matmul
from vkrt.ops.mul_mat_id import RouteTable, mul_mat_id
from vkrt.ops.stream_read import stream_dst_bytes, stream_read

# byte offsets of the fp16 scales in a block: random bytes elsewhere are valid data (types not
# listed keep random scale bits: the time does not depend on the values)
SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
          "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
          **{n: (0,) for n in ("IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S")}}


def random_weight(dev, name: str, k: int, m: int, e: int, rng) -> Tensor:
    t = ggml_type(name)
    w = Tensor.empty(dev, t, (k, m, e) if e > 1 else (k, m), name=f"{name} weight")
    rows = m * e
    if not t.quantized:
        write_tensor(w, (rng.standard_normal((rows, k)) * 0.02).astype(t.dtype))
        return w
    nblk = k // t.block_size
    raw = rng.integers(0, 256, (rows, nblk, t.type_size), dtype=np.uint8)
    for off in SCALES.get(name, ()):
        d = (rng.uniform(-1e-3, 1e-3, (rows, nblk, 1))).astype(np.float16).view(np.uint8)
        raw[:, :, off:off + 2] = d
    write_tensor(w, raw.reshape(e, m, nblk * t.type_size) if e > 1 else raw.reshape(m, nblk * t.type_size))
    return w




def timed(dev, record, reps: int) -> float:
    """Median GPU seconds of `reps` replays of what `record(seq)` records."""
    with CommandSequence(dev, timestamps=True, label="bench") as seq:
        with seq.record():
            record(seq)
        warm_up(seq.run)   # (pipelines are compiled while recording, the GPU idle meanwhile)
        times = []
        for _ in range(reps):
            seq.run()
            times.append(seq.gpu_time())
    return statistics.median(times)


def copy_gbs(dev, nbytes: int, reps: int) -> float:
    with Buffer(dev, nbytes, label="copy src") as a, Buffer(dev, nbytes, label="copy dst") as b:
        t = timed(dev, lambda seq: seq.copy(a.range(0, nbytes), b.range(0, nbytes)), reps)
    return 2 * nbytes / t / 1e9


def read_gbs(dev, srcs: list, reps: int) -> float:
    """GB/s of the streaming-read probe reading each buffer range of `srcs` in turn, one dispatch a
    range, a barrier between them (they share an output, as dependent mat-vecs share theirs)."""
    out = stream_dst_bytes(dev)
    with Buffer(dev, out, label="read peer out") as b:
        t = timed(dev, lambda seq: [stream_read(seq, r.sub(0, r.size // 16 * 16), b.range(0, out)) for r in srcs],
                  reps) / len(srcs)
    return srcs[0].size / t / 1e9


def dense_case(dev, ws: list[Tensor], n: int, reps: int, tuning, rng, overlap: bool = False) -> dict:
    """One matmul per weight copy in `ws`, timed together; per-copy averages. With `overlap` each
    copy writes its own output, so no barrier separates them (a streaming rate, not the latency
    of one dependent dispatch)."""
    k, m = ws[0].ne[0], ws[0].ne[1]
    x = tensor_from_numpy(dev, rng.standard_normal((n, k)).astype(np.float32))
    ys = [Tensor.empty(dev, "F32", (m, n)) for _ in (ws if overlap else ws[:1])]
    work = FlashWork(dev, label="GEMM split-K partials")   # a GEMM cut along K keeps its partial tiles there
    try:
        t = timed(dev, lambda seq: [matmul(seq, w, x, ys[i % len(ys)], tuning=tuning, work=work)
                                    for i, w in enumerate(ws)], reps) / len(ws)
    finally:
        work.close()
        x.close()
        for y in ys:
            y.close()
    return {"flops": 2.0 * k * m * n, "weight_bytes": ws[0].nbytes, "seconds": t}


def moe_case(dev, w: Tensor, n_used: int, n: int, reps: int, tuning, rng) -> dict:
    """mul_mat_id over rounds of routing drawn so that each round's tokens choose experts the
    rounds before did not (while the stack lasts): the rounds share one output, so they run as a
    decode step's dependent dispatches do, and a round reads experts the last one left out of the
    cache (one round replayed alone read its few experts from the L2). Per-round averages."""
    k, m, n_expert = w.ne[0], w.ne[1], w.ne[2]
    per_round = min(n_expert, n * n_used)
    rounds = max(1, min(16, n_expert // per_round))
    order = rng.permutation(n_expert)
    ids = []
    for i in range(rounds):
        fresh = order[(i * per_round + np.arange(per_round)) % n_expert]
        ids.append(np.stack([rng.choice(fresh, n_used, replace=False) for _ in range(n)]).astype(np.int32))
    x = tensor_from_numpy(dev, rng.standard_normal((n, 1, k)).astype(np.float32))
    its = [tensor_from_numpy(dev, i) for i in ids]
    y = Tensor.empty(dev, "F32", (m, n_used, n))
    routes = RouteTable(dev, n_expert, n)
    try:
        t = timed(dev, lambda seq: [mul_mat_id(seq, w, x, it, y, routes, tuning=tuning) for it in its], reps) / rounds
    finally:
        for h in (x, *its, y, routes):
            h.close()
    used = np.mean([len(np.unique(i)) for i in ids])
    return {"flops": 2.0 * k * m * n * n_used, "weight_bytes": w.nbytes / n_expert * used, "seconds": t,
            "experts_used": used, "rounds": rounds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q4_1")
    ap.add_argument("--n", default="1,512,2048", help="token counts")
    ap.add_argument("--shapes", default="dense,moe")
    ap.add_argument("--dense", default="4096x4096", help="KxM")
    ap.add_argument("--moe", default="2048x768x128x8", help="KxMxN_EXPERTxN_USED")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rotate-mib", type=int, default=512)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--peak-gbs", type=float, default=None)
    ap.add_argument("--peer-mib", type=int, default=1024, help="bytes the streaming-read peer reads (past the L2)")
    ap.add_argument("--overlap", action="store_true",
                    help="dense: each weight copy writes its own output, so the copies' dispatches are not "
                         "separated by barriers")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    k, m = (int(v) for v in args.dense.split("x"))
    mk, mm, me, mu = (int(v) for v in args.moe.split("x"))
    rows = []
    with Device(settings=bench_settings(args.set)) as dev:
        tuning = dev.tuning
        peer = copy_gbs(dev, k * m, args.reps)
        peer_bytes = min(args.peer_mib << 20, dev.profile.max_buffer_size, dev.profile.max_storage_buffer_range) // 16 * 16
        with Buffer(dev, peer_bytes, label="read peer") as a:
            read_peer = read_gbs(dev, [a.range(0, peer_bytes)] * 4, args.reps)
        for shape in args.shapes.split(","):
            for name in args.types.split(","):
                if shape == "dense":
                    ws = [random_weight(dev, name, k, m, 1, rng)]
                    while len(ws) < 64 and len(ws) * ws[0].nbytes < args.rotate_mib << 20:
                        ws.append(random_weight(dev, name, k, m, 1, rng))
                    w, dims = ws[0], f"{k}x{m}" + (f" x{len(ws)}" if len(ws) > 1 else "")
                else:
                    w, dims = random_weight(dev, name, mk, mm, me, rng), f"{mk}x{mm} {me}e/{mu}"
                    ws = [w]
                try:
                    # a read of each weight copy in turn: what a dispatch of the weight's size streams
                    size_peer = read_gbs(dev, [t.range() for t in ws], args.reps) if shape == "dense" else None
                    for n in (int(v) for v in args.n.split(",")):
                        if shape == "dense":
                            r = dense_case(dev, ws, n, args.reps, tuning, rng, args.overlap)
                        else:
                            r = moe_case(dev, w, mu, n, args.reps, tuning, rng)
                        gbs = r["weight_bytes"] / r["seconds"] / 1e9
                        tag = shape + ("/overlap" if args.overlap and shape == "dense" else "")
                        row = {"shape": tag, "dims": dims, "type": name, "n": n, "us": r["seconds"] * 1e6,
                               "gflops": r["flops"] / r["seconds"] / 1e9, "weight_gbs": gbs, "of_read": gbs / read_peer,
                               "of_copy": gbs / peer}
                        if shape == "moe":
                            row.update(rounds=r["rounds"], experts_a_round=r["experts_used"])
                        if shape == "dense" and n == 1:
                            row["read_at_size_gbs"] = size_peer
                            row["of_read_at_size"] = gbs / size_peer
                        if args.peak_gbs:
                            row["of_peak"] = gbs / args.peak_gbs
                        rows.append(row)
                        if not args.json:
                            print(_line(row), flush=True)
                finally:
                    for t in ws:
                        t.close()
        fields = ("mv_wg", "mv_rows", "mv_max_n", "mv_id_max_n", "mm_bm", "mm_bn", "mm_bk", "mm_tm", "mm_tn",
                  "mm_big_bm", "mm_big_bn")
        info = {**dev.identity(), "copy_gbs": peer, "read_peer_gbs": read_peer,
                "tuning": {f: getattr(tuning, f) for f in fields}}
    if args.json:
        json.dump({**info, "results": rows}, sys.stdout, indent=1)
        print()
    else:
        print(f"# {info['device']} ({info['architecture']}), streaming-read peer {read_peer:.1f} GB/s, "
              f"copy peer {peer:.1f} GB/s, tuning {info['tuning']}")
    return 0


def _line(r: dict) -> str:
    extra = f"  {100 * r['of_peak']:5.1f}% of peak" if "of_peak" in r else ""
    if "of_read_at_size" in r:
        extra += f"  {100 * r['of_read_at_size']:5.1f}% of a read of its size ({r['read_at_size_gbs']:.4g} GB/s)"
    return (f"{r['shape']:13} {r['dims']:>18} {r['type']:5} n={r['n']:<5} {r['us']:11.1f} us "
            f"{r['gflops']:9.1f} GFLOP/s {r['weight_gbs']:8.3g} GB/s  {100 * r['of_read']:5.1f}% of read "
            f"{100 * r['of_copy']:6.3g}% of copy{extra}")


if __name__ == "__main__":
    sys.exit(main())
