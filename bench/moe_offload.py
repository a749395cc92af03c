"""Prefill and decode of a MoE model with experts in host memory, next to llama.cpp.

    python bench/moe_offload.py MODEL.gguf [-p 2048] [-ub 2048] [-n 32] [-r 3] [--card-budget 8G]
                                [--vkrt-mmap] [--llama-server PATH | --no-llama] [--json]

vkrt configurations (all with flash attention): experts in VRAM; all experts in host memory
(--n-cpu-moe = n_layer) read through imported memory (--no-mmap; with --vkrt-mmap also through
the file mapping): with vkrt's host-expert paths off (no prefetch, decode reads experts in
place), on (3 prefetch slots, decode stages the chosen experts by type, no expert cache), and
on with the decode expert cache sized to what an 8 GB card (--card-budget) leaves free. llama.cpp (when
its server is found) runs the same placements. Reports prompt and generation t/s, prefill against
llama.cpp's all-in-VRAM and mmap-host figures, decode against llama.cpp's host-expert decode, the
bytes of experts moved per ubatch, the upload rate of the prefetch copies alone, and the share of
upload time hidden behind compute: hidden = (t_vram + t_upload - t_prefetch) / t_upload.
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
from vkrt.units import parse_size


def progress(row: dict) -> dict:
    """Each row on stderr as it is measured, so a run cut short still reports what it got."""
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def vkrt_rates(engine, prompt, n_gen, reps) -> tuple[float, float]:
    pp, tg = [], []
    for rep in range(reps + 1):
        engine.reset()
        t0 = time.perf_counter()
        engine.eval(prompt)
        t1 = time.perf_counter()
        tok = prompt[-1]
        for i in range(n_gen):
            engine.eval([tok])
            tok = (tok * 7 + i) % engine.model.cfg.vocab_size
        t2 = time.perf_counter()
        if rep:
            pp.append(len(prompt) / (t1 - t0))
            if n_gen:
                tg.append(n_gen / (t2 - t1))
    return statistics.median(pp), statistics.median(tg) if tg else 0.0


def upload_seconds(engine) -> float:
    """Time of one ubatch's expert uploads alone (all host layers, one after another)."""
    pf = engine.prefetch
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        last = 0
        for il in pf.layers:
            last = pf.upload(il, [])
        engine.device.transfer.wait(last)
        best = min(best, time.perf_counter() - t0)
    return best


def run_vkrt(path, args, device) -> list[dict]:
    rows = []
    prompt = random_tokens(args.n_prompt, 200, 1)
    n_ctx = args.n_prompt + args.n_gen + 16
    with Model(device, path, progress=False) as m:
        n_layer = m.cfg.n_layer
        with Engine(m, n_ctx=n_ctx, n_batch=args.ubatch, n_ubatch=args.ubatch) as e:
            pp, tg = vkrt_rates(e, prompt, args.n_gen, args.reps)
            rows.append(progress(dict(peer="vkrt", placement="experts in VRAM", prefetch=None, decode=None, pp_ts=pp,
                                      tg_ts=tg)))
    t_vram = args.n_prompt / rows[0]["pp_ts"]
    for mmap in (False, True) if args.vkrt_mmap else (False,):
        with Model(device, path, mmap=mmap, n_cpu_moe=n_layer, progress=False) as m:
            expert_bytes = sum(m.weights[n].nbytes for n in m.placement.host_tensors if "_exps." in n)
            label = f"experts on host ({'mmap' if mmap else '--no-mmap'}; " \
                    f"{'imported' if m.placement.host_imported else 'host-visible copy'})"
            # vkrt's host-expert paths off; prefetch and staging on; and with the decode expert
            # cache in what an 8 GB card (--card-budget) leaves free
            for slots, stage, budget in ((0, False, None), (3, None, None), (3, None, args.card_budget)):
                device.vram_budget = budget
                with Engine(m, n_ctx=n_ctx, n_batch=args.ubatch, n_ubatch=args.ubatch, prefetch_slots=slots,
                            stage_experts=stage, expert_cache=None if budget else 0) as e:
                    pp, tg = vkrt_rates(e, prompt, args.n_gen, args.reps)
                    decode = "in place" if stage is False else "by type"
                    if e.staging.cache_slots:
                        decode = (f"cache {e.staging.cache_slots}/{m.cfg.n_expert} per layer "
                                  f"({e.staging.nbytes / 2**30:.1f} GiB, {budget / 2**30:.0f} GiB card), "
                                  f"{100 * e.staging.hit_rate():.0f}% hits")
                    row = dict(peer="vkrt", placement=label, prefetch=slots, decode=decode, pp_ts=pp, tg_ts=tg,
                               bytes_per_ubatch=expert_bytes if slots else None,
                               vram_used_gib=device.vram_used / 2**30, cache_hit_rate=e.staging.hit_rate())
                    if slots and e.prefetch.active:
                        t_up = upload_seconds(e)
                        row["upload_gbps"] = expert_bytes / t_up / 1e9
                        row["hidden_share"] = max(0.0, min(1.0, (t_vram + t_up - args.n_prompt / pp) / t_up))
                    rows.append(progress(row))
                device.vram_budget = None
    return rows


def run_llama(binary, path, args, n_layer, polaris) -> list[dict]:
    rows = []
    prompt = random_tokens(args.n_prompt, 200, 1)
    env = POLARIS_ENV if polaris else {}
    common = ["-ngl", "99", "-c", str(args.n_prompt + args.n_gen + 64), "-b", str(args.ubatch), "-ub", str(args.ubatch),
              "-fa", "on", "--no-warmup"]
    placements = {"vram": ("experts in VRAM", []), "mmap": ("experts on host (mmap)", ["--n-cpu-moe", str(n_layer)]),
                  "no-mmap": ("experts on host (--no-mmap)", ["--n-cpu-moe", str(n_layer), "--no-mmap"])}
    for label, extra in (placements[p] for p in args.llama_placements.split(",")):
        try:
            with LlamaServer(binary, path, common + extra, env) as srv:
                srv.completion(prompt[:64], 1)  # warm-up: pipelines compiled
                pp = [srv.completion(prompt, 1)["prompt_per_second"] for _ in range(args.reps)]
                tg = [srv.completion(prompt[:32], args.n_gen)["predicted_per_second"]
                      for _ in range(max(1, args.reps // 2))]
        except RuntimeError as exc:  # e.g. its CPU backend dies (SIGILL) on CPUs without AVX-VNNI
            rows.append(progress(dict(peer="llama.cpp", placement=label, prefetch=None, decode=None, pp_ts=0.0,
                                      tg_ts=0.0, error=str(exc).splitlines()[0])))
            continue
        rows.append(progress(dict(peer="llama.cpp", placement=label, prefetch=None, decode=None,
                                  pp_ts=statistics.median(pp), tg_ts=statistics.median(tg))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=2048)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-ub", "--ubatch", type=int, default=2048)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--no-vkrt", action="store_true", help="only the llama.cpp rows")
    ap.add_argument("--llama-placements", default="vram,mmap,no-mmap",
                    help="llama.cpp's placements to run: vram, mmap, no-mmap (comma-separated)")
    ap.add_argument("--vkrt-mmap", action="store_true", help="also run vkrt's host experts through the file mapping")
    ap.add_argument("--card-budget", type=lambda v: parse_size(v, "--card-budget"), default=8 << 30,
                    help="VRAM of the emulated card for the expert-cache row (default 8G)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    settings = bench_settings()
    polaris = polaris_class(settings)
    with Device(settings=settings) as device:
        rows = [] if args.no_vkrt else run_vkrt(args.model, args, device)
        name = device.profile.name
        arch = device.profile.architecture.value
    n_layer = None
    binary = None if args.no_llama else find_server(args.llama_server)
    if binary:
        from vkrt.model.gguf_file import GGUFFile
        with GGUFFile(args.model, progress=False) as f:
            n_layer = f.metadata[f"{f.architecture}.block_count"]
        rows += run_llama(binary, args.model, args, n_layer, polaris)
    base = next((r["pp_ts"] for r in rows if r["peer"] == "llama.cpp" and r["placement"] == "experts in VRAM"
                 and r["pp_ts"]), None)
    host = next((r for r in rows if r["peer"] == "llama.cpp" and r["placement"] == "experts on host (mmap)"
                 and r["pp_ts"]), None)
    for r in rows:
        r["pp_vs_llama_vram"] = r["pp_ts"] / base if base else None
        r["pp_vs_llama_host_mmap"] = r["pp_ts"] / host["pp_ts"] if host else None
        r["tg_vs_llama_host_mmap"] = r["tg_ts"] / host["tg_ts"] if host and host["tg_ts"] else None
    if args.json:
        print(json.dumps({"device": name, "architecture": arch, "polaris_class": polaris, "n_prompt": args.n_prompt,
                          "ubatch": args.ubatch, "rows": rows}))
        return
    print(f"MoE prefill/decode on {name} ({arch}{', Polaris-class' if polaris else ''}), pp{args.n_prompt}, "
          f"ub {args.ubatch}")
    print("| peer | placement | prefetch | decode experts | pp t/s | tg t/s | pp vs llama.cpp VRAM | "
          "pp vs llama.cpp host mmap | tg vs llama.cpp host mmap | MB/ubatch | upload GB/s | hidden |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        def f(k, fmt):
            v = r.get(k)
            return fmt.format(v) if v is not None else "-"
        mb = f"{r['bytes_per_ubatch'] / 2**20:.0f}" if r.get("bytes_per_ubatch") else "-"
        print(f"| {r['peer']} | {r['placement']} | {f('prefetch', '{}')} | {f('decode', '{}')} | {r['pp_ts']:.1f} | {r['tg_ts']:.2f} | "
              f"{f('pp_vs_llama_vram', '{:.2f}x')} | {f('pp_vs_llama_host_mmap', '{:.2f}x')} | "
              f"{f('tg_vs_llama_host_mmap', '{:.2f}x')} | {mb} | {f('upload_gbps', '{:.1f}')} | {f('hidden_share', '{:.0%}')} |"
              + (f" failed: {r['error']}" if r.get("error") else ""))


if __name__ == "__main__":
    main()
