"""Prefill at depth: pp tokens after `depth` tokens already in the context (llama-bench's -d),
vkrt with flash-attention mask_opt forced off and on, next to llama.cpp in the same run.

    python bench/depth_prefill.py MODEL.gguf [-d 16384,32768] [-p 2048] [-ub 2048] [-r 2]
                                  [--n-cpu-moe N] [--no-mmap] [--llama-server PATH | --no-llama] [--json]

vkrt reads the depth once, then times `-r` prefills of p new tokens, each resumed from the depth:
the KV cells past it are dropped and, for models with a recurrent state (qwen35), the state is
restored from a checkpoint taken at the depth. llama.cpp's server reads the depth, then the depth
plus p new tokens with its prompt cache (only requests whose cached prefix covered the depth are
counted). Reports t/s and mask_opt's gain, and vkrt against llama.cpp at each depth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from common import bench_settings, polaris_class
from llama_peer import POLARIS_ENV, LlamaServer, find_server
from vkrt.device import Device
from vkrt.engine.engine import Engine
from vkrt.engine.generate import random_tokens
from vkrt.model.loader import Model


def vkrt_depth(model, depth: int, n_prompt: int, ubatch: int, reps: int) -> float:
    context = random_tokens(depth, 200, 1)
    with Engine(model, n_ctx=depth + n_prompt + 256, n_batch=ubatch, n_ubatch=ubatch, n_checkpoints=1) as e:
        e.eval(context)
        ckpt = e.save_state(0)
        rates = []
        for rep in range(reps + 1):   # the first run records the graphs
            t0 = time.perf_counter()
            e.eval(random_tokens(n_prompt, 200, 10 + rep))
            if rep:
                rates.append(n_prompt / (time.perf_counter() - t0))
            if ckpt is not None:
                e.restore_state(0, ckpt)
            else:
                e.reset(0, depth)
        return statistics.median(rates)


def llama_depth(binary, path, args, depth: int, polaris: bool) -> float | None:
    env = dict(POLARIS_ENV) if polaris else {}
    cmd = ["-ngl", "99", "-c", str(depth + args.n_prompt + 256), "-b", str(args.ubatch), "-ub", str(args.ubatch),
           "-fa", "on", "--no-warmup"]
    if args.n_cpu_moe:
        cmd += ["--n-cpu-moe", str(args.n_cpu_moe)]
    if args.no_mmap:
        cmd += ["--no-mmap"]
    context = random_tokens(depth, 200, 1)
    rates = []
    with LlamaServer(binary, path, cmd, env) as srv:
        srv.completion(context, 1, cache_prompt=True)
        for rep in range(args.reps + 1):
            t = srv.completion(context + random_tokens(args.n_prompt, 200, 10 + rep), 1, cache_prompt=True)
            if rep and t.get("prompt_n", 0) <= args.n_prompt + 64:   # served from the cached depth
                rates.append(t["prompt_per_second"])
    return statistics.median(rates) if rates else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-d", "--depth", default="16384,32768")
    ap.add_argument("-p", "--n-prompt", type=int, default=2048)
    ap.add_argument("-ub", "--ubatch", type=int, default=2048)
    ap.add_argument("-r", "--reps", type=int, default=2)
    ap.add_argument("--n-cpu-moe", type=int, default=0)
    ap.add_argument("--no-mmap", action="store_true")
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    depths = [int(d) for d in args.depth.split(",")]
    settings = bench_settings()
    polaris = polaris_class(settings)
    rows = []
    with Device(settings=settings) as device:
        name = device.profile.name
        with Model(device, args.model, mmap=not args.no_mmap, n_cpu_moe=args.n_cpu_moe, progress=False) as m:
            for depth in depths:
                row = {"depth": depth}
                for flag in (False, True):   # engines built now take mask_opt from the device's settings
                    device.settings = settings.replace(fa_mask_opt=flag)
                    row[f"vkrt_mask_opt_{'on' if flag else 'off'}_ts"] = vkrt_depth(
                        m, depth, args.n_prompt, args.ubatch, args.reps)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                device.settings = settings
                row["mask_opt_gain"] = row["vkrt_mask_opt_on_ts"] / row["vkrt_mask_opt_off_ts"] - 1
                rows.append(row)
    binary = None if args.no_llama else find_server(args.llama_server)
    for row in rows:
        row["llama_ts"] = llama_depth(binary, args.model, args, row["depth"], polaris) if binary else None
        best = max(row["vkrt_mask_opt_on_ts"], row["vkrt_mask_opt_off_ts"])
        row["vkrt_vs_llama"] = row["vkrt_mask_opt_on_ts"] / row["llama_ts"] if row["llama_ts"] else None
        row["best_vkrt_ts"] = best
        print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"device": name, "polaris_class": polaris, "n_prompt": args.n_prompt, "ubatch": args.ubatch,
                          "n_cpu_moe": args.n_cpu_moe, "rows": rows}))
        return
    print(f"pp{args.n_prompt} at depth on {name}{' (Polaris-class)' if polaris else ''}, ub {args.ubatch}, "
          f"--n-cpu-moe {args.n_cpu_moe}")
    print("| depth | vkrt mask_opt off t/s | vkrt mask_opt on t/s | mask_opt gain | llama.cpp t/s | vkrt vs llama.cpp |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        llama = f"{r['llama_ts']:.1f}" if r["llama_ts"] else "-"
        ratio = f"{r['vkrt_vs_llama']:.2f}x" if r["vkrt_vs_llama"] else "-"
        print(f"| {r['depth']} | {r['vkrt_mask_opt_off_ts']:.1f} | {r['vkrt_mask_opt_on_ts']:.1f} | "
              f"{100 * r['mask_opt_gain']:+.1f}% | {llama} | {ratio} |")


if __name__ == "__main__":
    main()
