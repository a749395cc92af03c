"""vkrt's decode and prompt rates with host-resident experts, over link speeds, CPU threads, where
the experts run and the expert cache, next to llama.cpp's CPU experts on the same file.

    python bench/cpu_moe_sweep.py MODEL.gguf -ncmoe N [--link-bandwidth unpaced,12,3,1]
        [--cpu-moe-threads 8,16] [--cpu-experts off,auto,all] [--expert-cache 0,card,auto]
        [--card-budget 8G] [-p 512] [-n 128] [-ub 512] [-r 3] [--llama-server PATH | --no-peer] [--json]

vkrt runs in this process, the model read into anonymous memory with the experts of its first N
layers in host memory (`-ncmoe N --no-mmap`): one row per --link-bandwidth (GB/s the expert copies
are paced to; `unpaced` not paced, whatever VKRT_LINK_BANDWIDTH says) x --cpu-moe-threads x --cpu-experts x
--expert-cache (0: none; `card`: what a card of --card-budget VRAM leaves, as `--vram-budget 8G`;
`auto`: what this device leaves; or a size). tg decodes a new random token each step, as
llama-bench (vkrt.engine.bench.run_test). With --cpu-experts off the CPU runs no expert, so those
rows are measured once, without a thread count.

llama.cpp's server runs the same file with `--n-cpu-moe N --no-mmap -t THREADS`, once per thread
count: its link is not paced and it has no expert cache (its experts of those layers run on the
CPU), and its tg is a greedy /completion. Each row's ratio is vkrt over llama.cpp at the row's
threads (off rows: llama.cpp's most).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

from common import bench_settings, polaris_class
from llama_peer import POLARIS_ENV, LlamaServer, find_server
from vkrt.device import Device
from vkrt.engine.bench import BenchTest, run_test
from vkrt.engine.engine import Engine
from vkrt.engine.generate import random_tokens
from vkrt.engine.options import CPU_EXPERTS, EngineOptions
from vkrt.errors import VkrtError
from vkrt.model.loader import Model
from vkrt.units import fmt_bytes, parse_size

UNPACED, CARD = "unpaced", "card"


def _list(text: str, parse) -> list:
    """A comma list, each item through `parse` (its ValueError or ConfigError: argparse's error)."""
    try:
        return [parse(v.strip()) for v in text.split(",") if v.strip()]
    except (ValueError, VkrtError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _number(v: str, kind):
    try:
        return kind(v)
    except ValueError:
        raise ValueError(f"{v!r} is not a number") from None


def _link(v: str) -> float | None:
    if v == UNPACED:
        return None
    if not _number(v, float) > 0:
        raise ValueError(f"{v!r}: a link rate is more than 0 GB/s (or {UNPACED})")
    return float(v)


def _threads(v: str) -> int:
    if _number(v, int) < 1:
        raise ValueError(f"{v!r}: give at least 1 thread")
    return int(v)


def _cpu_experts(v: str) -> str:
    if v not in CPU_EXPERTS:
        raise ValueError(f"{v!r} is not one of {', '.join(CPU_EXPERTS)}")
    return v


def _cache(v: str) -> str:
    if v not in (CARD, "auto"):
        parse_size(v, "--expert-cache")
    return v


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-ncmoe", "--n-cpu-moe", type=int, required=True,
                    help="the experts of the first N layers stay in host memory")
    ap.add_argument("--link-bandwidth", type=lambda t: _list(t, _link), default=[None, 12.0, 3.0, 1.0],
                    metavar="LIST", help="GB/s, or unpaced (default unpaced,12,3,1)")
    ap.add_argument("--cpu-moe-threads", type=lambda t: _list(t, _threads),
                    default=[len(os.sched_getaffinity(0))], metavar="LIST", help="default: this process's cores")
    ap.add_argument("--cpu-experts", type=lambda t: _list(t, _cpu_experts), default=list(CPU_EXPERTS),
                    metavar="LIST", help="off, auto, all (default all three)")
    ap.add_argument("--expert-cache", type=lambda t: _list(t, _cache), default=["0", CARD, "auto"], metavar="LIST",
                    help="0, card, auto or a size (default 0,card,auto)")
    ap.add_argument("--card-budget", type=lambda v: parse_size(v, "--card-budget"), default=8 << 30,
                    help="VRAM of the card whose expert cache `card` is (default 8G)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="0: no pp")
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-ub", "--ubatch", type=int, default=512)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--no-peer", action="store_true", help="vkrt's rows only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for name in ("n_cpu_moe", "n_gen", "ubatch", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.n_prompt < 0:
        ap.error("--n-prompt must not be negative (0: no pp)")
    return args


def configs(args) -> list[dict]:
    """The vkrt rows to measure: link x threads x cpu_experts x cache; off rows once, without threads."""
    out = []
    for link, threads, cpu, cache in itertools.product(args.link_bandwidth, args.cpu_moe_threads, args.cpu_experts,
                                                       args.expert_cache):
        row = dict(link_gbps=link, threads=None if cpu == "off" else threads, cpu_experts=cpu, cache=cache)
        if row not in out:
            out.append(row)
    return out


def cache_label(cache: str, card_budget: int) -> str:
    return f"{fmt_bytes(card_budget)} card" if cache == CARD else cache


def progress(row: dict) -> dict:
    """Each row on stderr as it is measured, so a run cut short still reports what it got."""
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def vkrt_row(model, config: dict, args) -> dict:
    """One configuration's tg and pp on `model`; a configuration the engine refuses gets `error`."""
    dev, cache = model.device, config["cache"]
    row = dict(config, cache=cache_label(cache, args.card_budget))
    budget = dev.vram_budget
    try:
        o = EngineOptions(n_ctx=max(256, -(-(max(args.n_prompt, args.n_gen) + 16) // 256) * 256),
                          n_ubatch=args.ubatch, n_cpu_moe=args.n_cpu_moe, mmap=False,
                          expert_cache=None if cache in (CARD, "auto") else parse_size(cache, "--expert-cache"),
                          cpu_experts=config["cpu_experts"], cpu_moe_threads=config["threads"],
                          link_bandwidth=config["link_gbps"])
        if cache == CARD:   # the automatic cache takes what the card leaves; what does not fit fails
            dev.vram_budget = args.card_budget
        with Engine(model, n_ctx=o.n_ctx, n_batch=o.n_batch, n_ubatch=o.n_ubatch, flash_attn=o.flash_attn,
                    expert_cache=o.expert_cache, cpu_experts=o.cpu_experts, cpu_moe_threads=o.cpu_moe_threads,
                    link_bandwidth=o.link_bandwidth) as engine:
            row["cache_experts_per_layer"] = engine.staging.cache_slots
            tg = run_test(engine, BenchTest(0, args.n_gen), args.reps)
            pp = run_test(engine, BenchTest(args.n_prompt, 0), args.reps) if args.n_prompt else None
    except VkrtError as exc:
        return progress(dict(row, error=str(exc).splitlines()[0]))
    finally:
        dev.vram_budget = budget
    shares = tg.expert_shares
    per_token = tg.bus_bytes_per_token
    return progress(dict(row, tg_ts=tg.avg_ts, pp_ts=pp and pp.avg_ts,
                         experts_cached_share=shares and shares[0], experts_copied_share=shares and shares[1],
                         experts_cpu_share=shares and shares[2],
                         bus_mb_per_token=None if per_token is None else per_token / 1e6))


def vkrt_rows(device, args) -> list[dict]:
    with Model(device, args.model, mmap=False, n_cpu_moe=args.n_cpu_moe, progress=False) as model:
        return [vkrt_row(model, c, args) for c in configs(args)]


def llama_row(binary: str, args, threads: int, polaris: bool) -> dict:
    """llama.cpp's tg and pp (medians over the repetitions) with its experts of the first N layers on the CPU."""
    n_ctx = max(args.n_prompt, args.n_gen + 32) + 64
    prompt = random_tokens(max(args.n_prompt, 32), 200, 1)
    flags = ["-ngl", "99", "-c", str(n_ctx), "-b", str(max(2048, args.ubatch)), "-ub", str(args.ubatch), "-fa", "on",
             "--no-warmup", "--n-cpu-moe", str(args.n_cpu_moe), "--no-mmap", "-t", str(threads)]
    row = dict(threads=threads)
    try:
        with LlamaServer(binary, args.model, flags, POLARIS_ENV if polaris else {}) as srv:
            srv.completion(prompt[:32], 4)   # warm-up: pipelines compiled
            runs = [srv.completion(prompt[:32], args.n_gen) for _ in range(args.reps)]
            short = [r.get("predicted_n", 0) for r in runs if r.get("predicted_n", 0) < args.n_gen]
            if short:   # a figure over fewer tokens is not this test's
                raise RuntimeError(f"llama.cpp timed {min(short)} of {args.n_gen} generated tokens")
            row["tg_ts"] = statistics.median(r["predicted_per_second"] for r in runs)
            if args.n_prompt:
                row["pp_ts"] = statistics.median(srv.completion(prompt[:args.n_prompt], 1)["prompt_per_second"]
                                                 for _ in range(args.reps))
    except (RuntimeError, OSError) as exc:   # the server died, or refused the request
        row["error"] = str(exc).splitlines()[0]
    return progress(row)


def add_ratios(rows: list[dict], peers: list[dict]) -> None:
    """Each vkrt row's tg and pp over llama.cpp's at its threads (off rows: llama.cpp's most)."""
    by_threads = {p["threads"]: p for p in peers if "error" not in p}
    for r in rows:
        peer = by_threads.get(r["threads"] if r["threads"] is not None else max(by_threads, default=None))
        r["llama_cpp_threads"] = peer and peer["threads"]
        r["ratio_vs_llama_cpp"] = {k: r[f"{k}_ts"] / peer[f"{k}_ts"] for k in ("tg", "pp")
                                   if peer and r.get(f"{k}_ts") and peer.get(f"{k}_ts")}


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(report: dict) -> str:
    lines = [f"host experts (-ncmoe {report['n_cpu_moe']} --no-mmap) on {report['device']}: tg{report['n_gen']} "
             f"(random tokens), pp{report['n_prompt']}, t/s",
             "| link GB/s | threads | cpu_experts | cache | tg | pp | experts % cache/copy/cpu | MB/tok | "
             "tg vs llama.cpp | pp vs llama.cpp |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        shares = ("/".join(f"{100 * r[k]:.0f}" for k in ("experts_cached_share", "experts_copied_share",
                                                         "experts_cpu_share")) if r.get("experts_cached_share")
                  is not None else "-")
        ratio = r.get("ratio_vs_llama_cpp", {})
        lines.append(f"| {r['link_gbps'] or UNPACED} | {_cell(r['threads'], 'd')} | "
                     f"{r['cpu_experts']} | {r['cache']} | {_cell(r.get('tg_ts'), '.2f')} | "
                     f"{_cell(r.get('pp_ts'), '.1f')} | {shares} | {_cell(r.get('bus_mb_per_token'), '.2f')} | "
                     f"{_cell(ratio.get('tg'), '.2f')} | {_cell(ratio.get('pp'), '.2f')} |"
                     + (f" failed: {r['error']}" if "error" in r else ""))
    for p in report["llama_cpp"]:
        lines.append(f"| {UNPACED} | {p['threads']} | llama.cpp | - | {_cell(p.get('tg_ts'), '.2f')} | "
                     f"{_cell(p.get('pp_ts'), '.1f')} | - | - | | |"
                     + (f" failed: {p['error']}" if "error" in p else ""))
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    settings = bench_settings(link_bandwidth=None)   # `unpaced` rows are unpaced whatever the environment says
    polaris = polaris_class(settings)
    try:
        with Device(settings=settings) as device:
            rows = vkrt_rows(device, args)
            name = device.profile.name
    except VkrtError as exc:   # the file, or the device
        sys.exit(f"cpu_moe_sweep.py: {exc}")
    binary = None if args.no_peer else find_server(args.llama_server)
    if args.no_peer:
        peers = []
    elif binary is None:
        peers = [dict(threads=t, error="no llama-server (--llama-server PATH)") for t in args.cpu_moe_threads]
    else:
        peers = [llama_row(binary, args, t, polaris) for t in args.cpu_moe_threads]
    add_ratios(rows, peers)
    report = dict(device=name, polaris_class=polaris, model=args.model, n_cpu_moe=args.n_cpu_moe,
                  n_prompt=args.n_prompt, n_gen=args.n_gen, n_ubatch=args.ubatch, repetitions=args.reps,
                  card_budget_bytes=args.card_budget, rows=rows, llama_cpp=peers)
    print(json.dumps(report) if args.json else table(report))


if __name__ == "__main__":
    main()
