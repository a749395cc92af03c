"""vkrt next to llama.cpp's server on the same model, device and -ub, in one run: pp512,
pp2048 (-ub 2048) and tg128 as t/s and ratios, plus vkrt's host time per decode step.

    python bench/peer.py [MODEL.gguf ...] [--synthetic smollm2,gemma3] [-r 3] [--rounds 1] [--json]

--synthetic writes random-weight models with the layer shapes and vocabulary sizes of
SmolLM2-135M (llama, Q4_1), Gemma 3 270M (gemma3, Q5_0) and Llama-3-8B (llama8b, Q4_K), for
machines without the real files. --rounds N runs both sides N times in turn (vkrt, llama.cpp,
vkrt, ...) and reports each side's median over the rounds with its range: on a shared machine a
side's figure can move several percent between minutes, and a single round puts all of one
side's runs in one stretch of time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from common import bench_settings, polaris_class
from llama_peer import POLARIS_ENV, LlamaServer, find_server
from vkrt.device import Device
from vkrt.engine.bench import BenchTest, run_test
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
    # Llama-3-8B's layer shapes and vocabulary in Q4_K: the dense model decode is measured on
    "llama8b": SyntheticSpec(arch="llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
                             n_ff=14336, n_ctx=8192, weight_type="Q4_K", pad_vocab_to=128256, random_blocks=True),
}
# (name, prompt tokens, generated tokens, -ub, depth: tokens in the context before the test)
ALL_TESTS = (("pp512", 512, 0, 512, 0), ("pp2048", 2048, 0, 2048, 0), ("tg128", 0, 128, 512, 0),
             ("pp64", 64, 0, 64, 0), ("tg16", 0, 16, 64, 0), ("tg128@d4096", 0, 128, 512, 4096),
             ("tg128@d16384", 0, 128, 512, 16384))
TESTS = ALL_TESTS[:3]


def context(depth: int) -> int:
    """The context both sides get: room for pp2048, or the depth and 256 more tokens."""
    return max(2304, depth + 256)


def vkrt_side(device, path, reps) -> dict:
    out = {}
    with Model(device, path, progress=False) as m:
        for name, n_p, n_g, ub, depth in TESTS:
            with Engine(m, n_ctx=context(depth), n_batch=max(ub, 512), n_ubatch=ub) as e:
                r = run_test(e, BenchTest(n_p, n_g, depth), reps)
                out[name] = r.avg_ts
                if n_g and not depth:   # a depth's prefill steps would count in the engine's stats
                    # recording a shape's graph (and on lavapipe compiling its shaders) is a one-time
                    # cost inside the first steps, not a decode step's
                    s = e.stats
                    out["host_ms_per_decode_step"] = 1e3 * (s.seconds - s.gpu_wait_seconds - s.record_seconds) / s.steps
    return out


def llama_side(binary, path, reps, polaris) -> dict:
    out = {}
    n_ctx = max(context(t[4]) for t in TESTS)
    prompt = random_tokens(n_ctx - 256, 200, 1)
    for ub in sorted({t[3] for t in TESTS}):
        args = ["-ngl", "99", "-c", str(n_ctx), "-b", str(max(ub, 512)), "-ub", str(ub), "-fa", "on", "--no-warmup"]
        try:
            with LlamaServer(binary, path, args, POLARIS_ENV if polaris else {}) as srv:
                srv.completion(prompt[:64], 4)
                for name, n_p, n_g, u, depth in TESTS:
                    if u != ub:
                        continue
                    if n_p:
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
    row = {"model": per_round[0]["model"]}
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    global TESTS
    TESTS = tuple(t for t in ALL_TESTS if t[0] in args.tests.split(","))
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
    rounds = [[{"model": label} for label, _ in models] for _ in range(args.rounds)]
    with Device(settings=settings) as device:
        dev_name = device.profile.name
        for rnd in rounds:   # vkrt's device stays open; each round reloads the models on both sides
            for row, (label, path) in zip(rnd, models):
                row["vkrt"] = vkrt_side(device, path, args.reps)
            for row, (label, path) in zip(rnd, models):
                row["llama.cpp"] = (llama_side(binary, path, args.reps, polaris) if binary
                                    else {"error": "no llama-server"})
    rows = [merged(per_model) for per_model in zip(*rounds)]
    if args.json:
        print(json.dumps({"device": dev_name, "polaris_class": polaris, "rounds": args.rounds, "rows": rows}))
        return
    print(f"vkrt vs llama.cpp on {dev_name}{' (Polaris-class configuration)' if polaris else ''}, t/s"
          + (f", medians of {args.rounds} rounds in turn (range)" if args.rounds > 1 else ""))
    print("| model | test | vkrt | llama.cpp | ratio |")
    print("|---|---|---:|---:|---:|")

    def shown(row, side, t):
        v = row[side].get(t)
        if v is None:
            return "None"
        lo_hi = row.get(side + "_range", {}).get(t)
        return f"{v:.1f}" + (f" ({lo_hi[0]:.1f}-{lo_hi[1]:.1f})" if lo_hi else "")

    for row in rows:
        for t, *_ in TESTS:
            print(f"| {row['model']} | {t} | {shown(row, 'vkrt', t)} | {shown(row, 'llama.cpp', t)} | "
                  f"{row['ratio_vkrt_vs_llama'].get(t, float('nan')):.2f} |")
        if "host_ms_per_decode_step" in row["vkrt"]:
            print(f"| {row['model']} | host ms per decode step (vkrt) | {row['vkrt']['host_ms_per_decode_step']:.2f} | | |")
        if "error" in row["llama.cpp"]:
            print(f"llama.cpp failed on {row['model']}: {row['llama.cpp']['error']}")


if __name__ == "__main__":
    main()
