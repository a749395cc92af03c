"""Resuming a long prefix from host RAM (the server's --cache-ram prompt cache) against reading it
cold: what a session whose slot another session took saves when it comes back.

    python bench/prompt_cache.py MODEL.gguf [-p 16384] [-s 64] [-ub 2048] [-r 2]
                                 [--n-cpu-moe N] [--no-mmap] [--json]

cold: a fresh sequence reads the prefix and then the suffix (a new user turn); resume: the
prefix's KV cells and (qwen35, qwen35moe) recurrent state, read to host memory once
(vkrt/engine/kv_transfer.py, as the prompt cache saves a slot: save_s), are written back into an
empty sequence (restore_s) and only the suffix is read (suffix_s). The suffix's logits are
compared both ways: bit-identical where the steps are deterministic (lavapipe, experts in VRAM);
where they are not (host experts whose CPU/GPU split follows measured rates), the resumed run
must stay within 4x of two cold runs' difference (+1e-3 of the largest logit), else the script
fails. The prefix defaults to 16384 tokens on a GPU, 1024 on a CPU device
(lavapipe). Prints a table; --json prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from common import bench_settings, opened

from vkrt.device import Device
from vkrt.engine.generate import random_tokens
from vkrt.engine.kv_transfer import read_kv, read_state, write_kv, write_state


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run(engine, prefix: list[int], suffix: list[int], reps: int) -> dict:
    vocab = engine.model.cfg.vocab_size
    cold, resume, restores, saves = [], [], [], []
    first, resumed_diff, cold_diff, same_top = None, 0.0, 0.0, 1.0
    for rep in range(reps + 1):   # the first run records the graphs
        engine.reset()
        ref, t_cold = timed(lambda: (engine.eval(prefix), engine.eval(suffix, all_logits=True))[1])
        first = ref if first is None else first
        cold_diff = max(cold_diff, float(np.abs(ref - first).max()))
        engine.reset()
        engine.eval(prefix)
        (block, state), t_save = timed(lambda: (read_kv(engine, 0, len(prefix)), read_state(engine, 0)))
        engine.reset()

        def put_back(block=block, state=state):
            write_kv(engine, 0, block)
            write_state(engine, 0, state, len(prefix))
        _, t_restore = timed(put_back)
        out, t_suffix = timed(lambda: engine.eval(suffix, all_logits=True))
        resumed_diff = max(resumed_diff, float(np.abs(out - ref).max()))
        same_top = min(same_top, float(np.mean(out.reshape(-1, vocab).argmax(1) == ref.reshape(-1, vocab).argmax(1))))
        if resumed_diff > max(cold_diff, 0.0) * 4 + 1e-3 * float(np.abs(ref).max()):
            raise SystemExit(f"the resumed suffix's logits differ from the cold run's by {resumed_diff:.3g} "
                             f"(two cold runs differ by {cold_diff:.3g}; vocab {vocab})")
        if rep:
            cold.append(t_cold)
            saves.append(t_save)
            restores.append(t_restore)
            resume.append(t_restore + t_suffix)
    host = block.nbytes + sum(s.nbytes for s in state)
    row = {"prefix": len(prefix), "suffix": len(suffix), "host_mib": host / 2**20,
           "cold_prompt_s": statistics.median(cold), "save_s": statistics.median(saves),
           "restore_s": statistics.median(restores), "resume_s": statistics.median(resume)}
    row["suffix_s"] = row["resume_s"] - row["restore_s"]
    row["speedup_vs_cold"] = row["cold_prompt_s"] / row["resume_s"]
    row["saved_s"] = row["cold_prompt_s"] - row["resume_s"]
    row["copy_gbps"] = host / 1e9 / max(row["save_s"], row["restore_s"])
    row.update(bit_identical=resumed_diff == 0.0, max_abs_diff_vs_cold=resumed_diff, cold_runs_max_abs_diff=cold_diff,
               same_top_token=same_top)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--prefix", type=int, default=None,
                    help="prefix tokens (default 16384; 1024 on a CPU device)")
    ap.add_argument("-s", "--suffix", type=int, default=64)
    ap.add_argument("-ub", "--ubatch", type=int, default=2048)
    ap.add_argument("-r", "--reps", type=int, default=2)
    ap.add_argument("--n-cpu-moe", type=int, default=0, help="expert layers in host memory")
    ap.add_argument("--no-mmap", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with Device(settings=bench_settings()) as device:
        cpu = device.profile.device_type == "cpu"
        n_prefix = args.prefix or (1024 if cpu else 16384)
        ub = min(args.ubatch, 256) if cpu and args.ubatch == 2048 else args.ubatch
        with opened(device, args.model, n_ctx=n_prefix + args.suffix + 256, n_batch=ub, n_ubatch=ub,
                    n_cpu_moe=args.n_cpu_moe or None, mmap=not args.no_mmap) as (model, engine):
            vocab = model.cfg.vocab_size
            row = run(engine, random_tokens(n_prefix, vocab, 1), random_tokens(args.suffix, vocab, 2), args.reps)
            row.update(device=device.profile.name, model=model.cfg.arch, kv_type=engine.cache.type.name,
                       recurrent=engine.recurrent, n_cpu_moe=args.n_cpu_moe, ubatch=ub)
    if args.json:
        print(json.dumps(row))
        return
    print(f"prompt cache resume on {row['device']} ({row['model']}, KV {row['kv_type']}, ub {ub}, "
          f"--n-cpu-moe {args.n_cpu_moe}); {row['host_mib']:.1f} MiB in host memory; "
          + ("bit-identical to the cold run" if row["bit_identical"] else
             f"max |diff| vs the cold run {row['max_abs_diff_vs_cold']:.3g} (cold runs differ by "
             f"{row['cold_runs_max_abs_diff']:.3g}), same top token {100 * row['same_top_token']:.1f} %"))
    print("| prefix | suffix | cold s | save s | restore s | suffix s | resume s | speed-up | copy GB/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {row['prefix']} | {row['suffix']} | {row['cold_prompt_s']:.3f} | {row['save_s']:.3f} | "
          f"{row['restore_s']:.3f} | {row['suffix_s']:.3f} | {row['resume_s']:.3f} | {row['speedup_vs_cold']:.1f}x | "
          f"{row['copy_gbps']:.2f} |")


if __name__ == "__main__":
    main()
