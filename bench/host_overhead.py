"""Host cost of a dispatch: re-recording the command buffer every time vs. replaying it.

    python bench/host_overhead.py [--dispatches 100] [--iters 30] [--json]

A chain of `--dispatches` small dependent adds (x += y), as in a model's layer graph, is
(a) recorded, submitted and waited for on every iteration, and (b) recorded once and then
only submitted and waited for. Microseconds per dispatch, wall clock, median of iterations;
"host part" is the submit call alone, i.e. what replay costs the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from vkrt.commands import CommandSequence, upload
from vkrt.device import Device
from vkrt.memory import F32, Buffer, Tensor
from vkrt.ops.elementwise import add


def record_chain(seq, x, y, n, dispatches):
    tx, ty = Tensor.on(x.range(), F32, (n,)), Tensor.on(y.range(), F32, (n,))
    with seq.record():
        for _ in range(dispatches):
            add(seq, tx, ty, tx)


def measure(dispatches: int, iters: int, n: int) -> dict:
    with Device() as dev, Buffer(dev, 4 * n) as x, Buffer(dev, 4 * n) as y, CommandSequence(dev) as seq:
        upload(dev, x, np.zeros(n, np.float32))
        upload(dev, y, np.ones(n, np.float32))
        record_chain(seq, x, y, n, dispatches)  # warm-up: kernels compiled and cached
        seq.run()

        record_only, rerecord, replay = [], [], []
        for _ in range(iters):
            t0 = time.perf_counter()
            record_chain(seq, x, y, n, dispatches)
            t1 = time.perf_counter()
            seq.run()
            t2 = time.perf_counter()
            record_only.append(t1 - t0)
            rerecord.append(t2 - t0)
        submit_only = []
        for _ in range(iters):
            t0 = time.perf_counter()
            seq.submit()
            t1 = time.perf_counter()
            seq.wait()
            replay.append(time.perf_counter() - t0)
            submit_only.append(t1 - t0)

        def us(samples):
            return statistics.median(samples) / dispatches * 1e6

        return {
            **dev.identity(),
            "dispatches": dispatches,
            "iters": iters,
            "elements": n,
            "record_us_per_dispatch": us(record_only),
            "rerecord_us_per_dispatch": us(rerecord),
            "replay_us_per_dispatch": us(replay),
            "replay_host_us_per_dispatch": us(submit_only),
            "speedup_replay_vs_rerecord": statistics.median(rerecord) / statistics.median(replay),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dispatches", type=int, default=100)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--elements", type=int, default=256)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    r = measure(args.dispatches, args.iters, args.elements)
    if args.json:
        print(json.dumps(r))
        return
    print(f"host overhead on {r['device']} ({r['architecture']}), chain of {r['dispatches']} dependent dispatches")
    print(f"| {'mode':<30} | {'us / dispatch':>13} |")
    print(f"|{'-' * 32}|{'-' * 15}|")
    print(f"| {'record only':<30} | {r['record_us_per_dispatch']:>13.1f} |")
    print(f"| {'re-record + submit + wait':<30} | {r['rerecord_us_per_dispatch']:>13.1f} |")
    print(f"| {'replay (submit + wait)':<30} | {r['replay_us_per_dispatch']:>13.1f} |")
    print(f"| {'replay, host part (submit)':<30} | {r['replay_host_us_per_dispatch']:>13.2f} |")
    print(f"replay is {r['speedup_replay_vs_rerecord']:.1f}x faster than re-recording")


if __name__ == "__main__":
    main()
