"""Host time of the DeltaNet catch-ups a server's speculative steps take (RecurrentState.catch_up):
sequences verified together in steps of varying length, each taken back to a random accepted
count, so the spans (first kept column, tokens) vary as a server's do.

    python bench/catch_up_host.py [MODEL.gguf] [--slots 4] [--rounds 60] [--seed 0] [--json]

Default model: a generated qwen35moe of 40 layers (30 DeltaNet, Qwen3.5-35B-A3B's count) with
tiny widths, so that the time is the host's recording and submitting, not the GPU's. Each round
snapshots every slot, verifies 2-9 tokens a slot in one step and truncates each slot to a random
accepted count of them. Prints the host milliseconds of the truncates: the mean over all, the
median, and the mean over the last half (after each slot's first catch-up recorded its sequence).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from common import delta_net_model, lacks_delta_net, print_json
from vkrt.device import Device
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model

LAYERS = 40
MAX_TOKENS = 9


def run(model, slots: int, rounds: int, seed: int) -> list[float]:
    """Host milliseconds of each catch-up, in order."""
    rng = np.random.default_rng(seed)
    times = []
    with Engine(model, n_ctx=slots * (32 + rounds * MAX_TOKENS), n_ubatch=max(16, slots * MAX_TOKENS), n_seq_max=slots,
                verify_tokens=slots * MAX_TOKENS) as e:
        for s in range(slots):
            e.eval(list(range(5, 30)), s)
        for _ in range(rounds):
            n = int(rng.integers(2, MAX_TOKENS + 1))
            lengths = [e.snapshot(s) for s in range(slots)]
            e.mixed([(s, [40 + j for j in range(n)]) for s in range(slots)], rows=[n] * slots)
            for s in range(slots):
                t0 = time.perf_counter()
                e.truncate(s, lengths[s] + int(rng.integers(1, n)))
                times.append(1000.0 * (time.perf_counter() - t0))
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.slots < 1 or args.rounds < 2:
        ap.error("--slots takes 1 or more, --rounds 2 or more")
    with tempfile.TemporaryDirectory() as tmp, Device() as dev:
        path = args.model or delta_net_model(tmp, LAYERS)
        with Model(dev, path, progress=False) as m:
            if lacks_delta_net(m.cfg, path):
                return 2
            t = np.array(run(m, args.slots, args.rounds, args.seed))
            info = {"model": os.path.basename(path), "device": dev.identity()["device"],
                    "delta_net_layers": len(m.cfg.linear_layers), "slots": args.slots, "catch_ups": int(t.size),
                    "host_ms_mean": float(t.mean()), "host_ms_median": float(np.median(t)),
                    "host_ms_mean_last_half": float(t[t.size // 2:].mean())}
    if args.json:
        print_json(info)
        return 0
    print(f"# {info['model']} ({info['delta_net_layers']} DeltaNet layers) on {info['device']}, {args.slots} slots")
    print("| catch-ups | host ms mean | median | mean, last half |")
    print("|---:|---:|---:|---:|")
    print(f"| {info['catch_ups']} | {info['host_ms_mean']:.2f} | {info['host_ms_median']:.2f} "
          f"| {info['host_ms_mean_last_half']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
