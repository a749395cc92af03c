"""vkrt next to llama.cpp's server on the same model, device and -ub, in one run: pp512,
pp2048 (-ub 2048) and tg128 as t/s and ratios, plus vkrt's host time per decode step.

    python bench/peer.py [MODEL.gguf ...] [--synthetic smollm2,gemma3] [-r 3] [--rounds 1] [--json]
                         [--tests pp512,pp2048,tg128] [-d 0,4096,16384,32768,65536]
                         [-ctk f16,q8_0] [-ctv f16,q8_0]

-d runs each test at each depth (tokens in the context before it, named test@dDEPTH, as
llama-bench's -d); -ctk / -ctv give both sides the same K and V cache types (comma lists: their
cross product, a row each, as llama-bench), flash attention on.

--synthetic writes random-weight models with the layer shapes and vocabulary sizes of
SmolLM2-135M (llama, Q4_1), Gemma 3 270M (gemma3, Q5_0) and Llama-3.1-8B (llama8b, Q4_K, its
131072-token context: llama-server caps a slot at the training context), for machines without
the real files. --rounds N runs both sides N times in turn (vkrt, llama.cpp,
vkrt, ...) and reports each side's median over the rounds with its range: on a shared machine a
side's figure can move several percent between minutes, and a single round puts all of one
side's runs in one stretch of time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile

from common import bench_settings, polaris_class
from llama_peer import POLARIS_ENV, LlamaServer, find_server
from vkrt.device import Device
from vkrt.engine.bench import BenchTest, DepthFill, run_test
from vkrt.engine.engine import Engine
from vkrt.engine.generate import random_tokens
from vkrt.model.loader import Model
from vkrt.model.synthetic import SyntheticSpec, write_model

SHAPES = {
    "smollm2": SyntheticSpec(arch="llama", n_layer=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64, n_ff=1536,
                             n_ctx=8192, weight_type="Q4_1", pad_vocab_to=49152, random_blocks=True),
    "gemma3": SyntheticSpec(arch="gemma3", n_layer=18, n_embd=640, n_head=4, n_head_kv=1, head_dim=256, n_ff=2048,
                            n_ctx=32768, weight_type="Q5_0", sliding_window=512, pad_vocab_to=262144,
                            random_blocks=True),
    # Llama-3.1-8B's layer shapes and vocabulary in Q4_K: the dense model decode is measured on
    "llama8b": SyntheticSpec(arch="llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
                             n_ff=14336, n_ctx=131072, weight_type="Q4_K", pad_vocab_to=128256, random_blocks=True),
}
# (name, prompt tokens, generated tokens, -ub, depth: tokens in the context before the test)
ALL_TESTS = (("pp512", 512, 0, 512, 0), ("pp2048", 2048, 0, 2048, 0), ("tg128", 0, 128, 512, 0),
             ("pp64", 64, 0, 64, 0), ("tg16", 0, 16, 64, 0), ("tg128@d4096", 0, 128, 512, 4096),
             ("tg128@d16384", 0, 128, 512, 16384))
TESTS = ALL_TESTS[:3]
KV_TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")   # -ctk / -ctv


def at_depths(names: list[str], depths: list[int]) -> tuple:
    """TESTS entries for test `names` (of ALL_TESTS) at each of `depths` (a name with its own
    @d keeps it); ValueError naming an unknown test."""
    known = {t[0]: t for t in ALL_TESTS}
    out = []
    for name in names:
        if name not in known:
            raise ValueError(f"unknown test {name!r}; choose from {', '.join(known)}")
        base = known[name]
        for depth in ([base[4]] if base[4] else depths):
            entry = (base[0].split("@")[0] + (f"@d{depth}" if depth else ""), *base[1:4], depth)
            if entry not in out:
                out.append(entry)
    return tuple(out)


def kv_types(text: str, what: str) -> list[str]:
    """-ctk / -ctv: comma-separated KV cache types; ValueError naming a bad one and the choices."""
    out = [w.strip().lower() for w in text.split(",")]
    for w in out:
        if w not in KV_TYPES:
            raise ValueError(f"{what}: {w!r} is not a KV cache type; choose from {', '.join(KV_TYPES)}")
    return out


def context(depth: int, n_prompt: int = 0) -> int:
    """The context both sides get: room for pp2048, or the depth, the prompt and 256 more tokens."""
    return max(2304, depth + n_prompt + 256)


def vkrt_side(device, path, reps, kv=("f16", "f16")) -> dict:
    """vkrt's figures: one engine a micro-batch size, sized for its deepest test, whose tests run
    by depth, each deeper one adding only the tokens past the last's depth (DepthFill), as
    llama.cpp's side extends its cached prompt."""
    out = {}
    with Model(device, path, progress=False) as m:
        for ub in sorted({t[3] for t in TESTS}):
            tests = sorted((t for t in TESTS if t[3] == ub), key=lambda t: t[4])
            n_ctx = max(context(depth, n_p) for _, n_p, _, _, depth in tests)
            with Engine(m, n_ctx=n_ctx, n_batch=max(ub, 512), n_ubatch=ub, kv_type=kv[0].upper(),
                        kv_type_v=kv[1].upper()) as e:
                fill = DepthFill()
                for name, n_p, n_g, _, depth in tests:
                    before = dataclasses.replace(e.stats)
                    out[name] = run_test(e, BenchTest(n_p, n_g, depth), reps, fill=fill).avg_ts
                    if n_g and not depth:   # a depth's prefill steps would count in the engine's stats
                        # recording a shape's graph (and on lavapipe compiling its shaders) is a
                        # one-time cost inside the first steps, not a decode step's
                        s = e.stats
                        host = (s.seconds - before.seconds) - (s.gpu_wait_seconds - before.gpu_wait_seconds) \
                            - (s.record_seconds - before.record_seconds)
                        out["host_ms_per_decode_step"] = 1e3 * host / (s.steps - before.steps)
    return out


def llama_side(binary, path, reps, polaris, kv=("f16", "f16")) -> dict:
    out = {}
    n_ctx = max(context(t[4], t[1]) for t in TESTS)
    prompt = random_tokens(n_ctx - 256, 200, 1)
    for ub in sorted({t[3] for t in TESTS}):
        args = ["-ngl", "99", "-c", str(n_ctx), "-b", str(max(ub, 512)), "-ub", str(ub), "-fa", "on", "--no-warmup",
                "-ctk", kv[0], "-ctv", kv[1]]
        try:
            with LlamaServer(binary, path, args, POLARIS_ENV if polaris else {}) as srv:
                srv.completion(prompt[:64], 4)
                for name, n_p, n_g, u, depth in TESTS:
                    if u != ub:
                        continue
                    if n_p and depth:   # the depth cached once, then a new prompt after it each run
                        srv.completion(prompt[:depth], 1, cache_prompt=True)
                        runs = [srv.completion(prompt[:depth] + random_tokens(n_p, 200, 10 + r), 1, cache_prompt=True)
                                for r in range(reps)]
                        if any(r.get("prompt_n") != n_p for r in runs):   # the depth was evaluated again
                            raise RuntimeError(f"{name}: llama.cpp evaluated {[r.get('prompt_n') for r in runs]} "
                                               f"prompt tokens, not the {n_p} after the cached depth")
                        out[name] = statistics.median(r["prompt_per_second"] for r in runs)
                    elif n_p:
                        out[name] = statistics.median(srv.completion(prompt[:n_p], 1)["prompt_per_second"]
                                                      for _ in range(reps))
                    else:   # the depth's prompt is evaluated once and then reused from the cache
                        head = prompt[:max(depth, 16)]
                        runs = [srv.completion(head, n_g, cache_prompt=True) for _ in range(reps)]
                        short = [r.get("predicted_n", 0) for r in runs if r.get("predicted_n", 0) < n_g]
                        if short:   # a figure over fewer tokens (or none: 0 t/s) is not this test's
                            raise RuntimeError(f"{name}: llama.cpp timed {min(short)} of {n_g} tokens "
                                               f"(predicted_per_second {runs[0].get('predicted_per_second')})")
                        out[name] = statistics.median(r["predicted_per_second"] for r in runs)
        except (RuntimeError, OSError) as exc:  # server died, or refused the request
            out["error"] = str(exc).splitlines()[0]
    return out


def merged(per_round: tuple[dict, ...]) -> dict:
    """One model's rounds as one row: each side's median per figure (and its range over the rounds
    where there are several), and the ratio of the medians."""
    row = {"model": per_round[0]["model"], "type_k": per_round[0]["type_k"], "type_v": per_round[0]["type_v"]}
    for side in ("vkrt", "llama.cpp"):
        figures = {k for r in per_round for k, v in r[side].items() if isinstance(v, float)}
        row[side] = {k: statistics.median(r[side][k] for r in per_round if k in r[side]) for k in figures}
        errors = [r[side]["error"] for r in per_round if "error" in r[side]]
        if errors:
            row[side]["error"] = errors[0]
        if len(per_round) > 1:
            row[side + "_range"] = {k: (min(r[side][k] for r in per_round if k in r[side]),
                                        max(r[side][k] for r in per_round if k in r[side])) for k in figures}
    row["ratio_vkrt_vs_llama"] = {t: row["vkrt"][t] / row["llama.cpp"][t] for t, *_ in TESTS
                                  if row["llama.cpp"].get(t)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--synthetic", default="", help="comma-separated: smollm2, gemma3, llama8b")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="both sides this many times in turn; medians reported")
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--tests", default="pp512,pp2048,tg128",
                    help="of " + ", ".join(t[0] for t in ALL_TESTS))
    ap.add_argument("-d", "--n-depth", default="0", help="depths each test runs at, comma-separated (e.g. "
                    "0,4096,16384,32768,65536)")
    ap.add_argument("-ctk", "--cache-type-k", default="f16",
                    help=f"K cache types, comma-separated: {', '.join(KV_TYPES)}")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", help="V cache types, comma-separated")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    global TESTS
    try:
        depths = [int(d) for d in args.n_depth.split(",")]
        if any(d < 0 for d in depths):
            raise ValueError(f"-d: {args.n_depth!r} holds a negative depth")
        TESTS = at_depths(args.tests.split(","), depths)
        kvs = [(k, v) for k in kv_types(args.cache_type_k, "-ctk") for v in kv_types(args.cache_type_v, "-ctv")]
    except ValueError as exc:
        ap.error(str(exc))
    settings = bench_settings()
    polaris = polaris_class(settings)
    models = [(os.path.basename(m), m) for m in args.models]
    tmp = tempfile.mkdtemp()
    for name in filter(None, args.synthetic.split(",")):
        path = os.path.join(tmp, f"synthetic-{name}.gguf")
        write_model(path, SHAPES[name])
        models.append((f"{name}-shaped (random weights)", path))
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    binary = find_server(args.llama_server)
    runs = [(label, path, kv) for label, path in models for kv in kvs]
    rounds = [[{"model": label, "type_k": kv[0], "type_v": kv[1]} for label, _, kv in runs] for _ in range(args.rounds)]
    with Device(settings=settings) as device:
        dev_name = device.profile.name
        for rnd in rounds:   # vkrt's device stays open; each round reloads the models on both sides
            for row, (label, path, kv) in zip(rnd, runs):
                row["vkrt"] = vkrt_side(device, path, args.reps, kv)
            for row, (label, path, kv) in zip(rnd, runs):
                row["llama.cpp"] = (llama_side(binary, path, args.reps, polaris, kv) if binary
                                    else {"error": "no llama-server"})
    rows = [merged(per_model) for per_model in zip(*rounds)]
    if args.json:
        print(json.dumps({"device": dev_name, "polaris_class": polaris, "rounds": args.rounds, "rows": rows}))
        return
    print(f"vkrt vs llama.cpp on {dev_name}{' (Polaris-class configuration)' if polaris else ''}, t/s"
          + (f", medians of {args.rounds} rounds in turn (range)" if args.rounds > 1 else ""))
    print("| model | type_k | type_v | test | vkrt | llama.cpp | ratio |")
    print("|---|---|---|---|---:|---:|---:|")

    def shown(row, side, t):
        v = row[side].get(t)
        if v is None:
            return "None"
        lo_hi = row.get(side + "_range", {}).get(t)
        return f"{v:.1f}" + (f" ({lo_hi[0]:.1f}-{lo_hi[1]:.1f})" if lo_hi else "")

    for row in rows:
        for t, *_ in TESTS:
            print(f"| {row['model']} | {row['type_k']} | {row['type_v']} | {t} | {shown(row, 'vkrt', t)} | "
                  f"{shown(row, 'llama.cpp', t)} | {row['ratio_vkrt_vs_llama'].get(t, float('nan')):.2f} |")
        if "host_ms_per_decode_step" in row["vkrt"]:
            print(f"| {row['model']} | {row['type_k']} | {row['type_v']} | host ms per decode step (vkrt) | "
                  f"{row['vkrt']['host_ms_per_decode_step']:.2f} | | |")
        if "error" in row["llama.cpp"]:
            print(f"llama.cpp failed on {row['model']}: {row['llama.cpp']['error']}")


if __name__ == "__main__":
    main()
