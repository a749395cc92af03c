"""What a server's steps cost: decode steps of several slots, and mixed steps (Engine.mixed) that
carry a prompt chunk along with the slots' decode tokens, as `vkrt serve` runs them.

    python bench/server_steps.py MODEL.gguf [--slots 16] [--context 100] [--tokens 64,128,256,512]
                                 [--reps 5] [--json]

Every slot first holds --context tokens (read in steps of the micro-batch). A decode step of n
slots reads each slot's candidates (as the server's samplers do); a mixed step of T tokens holds
n decode tokens and T - n prompt tokens of one more sequence (whose cells are dropped after each
repetition). The table gives the median milliseconds a step, per token, and the ratio to the
decode step of the same n: what --max-itl-ratio compares against.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from common import bench_settings, opened

from vkrt.device import Device


def _median_ms(fn, reps: int) -> float:
    fn()   # records the shape's graph
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--generating", default="1,4,16", help="decode tokens in a step (comma-separated)")
    ap.add_argument("--context", type=int, default=100, help="tokens each slot holds")
    ap.add_argument("--tokens", default="64,128,256,512", help="mixed step sizes (comma-separated)")
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a resolved tuning field (repeatable), e.g. mm_split_groups=0: no split-K GEMM")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    gens = [int(n) for n in args.generating.split(",")]
    sizes = [int(n) for n in args.tokens.split(",")]
    if args.context < 1:
        sys.exit("server_steps: --context must be at least 1 token")
    if max(gens) >= args.slots or max(sizes) > args.ubatch:
        sys.exit("server_steps: --generating must stay below --slots and --tokens within --ubatch")
    with Device(settings=bench_settings(args.set)) as dev:
        rows = steps(args, dev, gens, sizes)
    if args.json:
        print(json.dumps({"model": args.model, **dev.identity(), "context": args.context, "steps": rows}))
        return 0
    print(f"# {args.model} on {dev.profile.name}: every slot holds {args.context} tokens")
    print("| step | decode tokens | tokens | ms | ms a token | x decode step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['step']} | {r['generating']} | {r['tokens']} | {r['ms']:.1f} | {r['ms_per_token']:.3f} | "
              f"{r['ratio_to_decode']:.2f} |")
    return 0


def steps(args, dev, gens, sizes) -> list[dict]:
    """The table's rows: each decode step of n generating slots, then the mixed steps of each size."""
    rows = []
    with opened(dev, args.model, n_ctx=max(4096, args.slots * (args.context + 2 * args.ubatch)),
                n_ubatch=args.ubatch, n_batch=args.ubatch, n_seq_max=args.slots) as (m, e):
        vocab = m.cfg.vocab_size
        for s in range(args.slots):   # each slot's context in micro-batch-sized steps
            tokens = [1 + (s * 31 + i) % (vocab - 1) for i in range(args.context)]
            for at in range(0, len(tokens), args.ubatch):
                e.mixed([(s, tokens[at:at + args.ubatch])])
        reader = args.slots - 1   # the sequence whose prompt chunk rides along
        for n in gens:
            pairs = [(s, 7) for s in range(n)]
            keep = {s: e.sequence_length(s) for s in range(n)}

            def rewind():
                for s, length in keep.items():
                    e.reset(s, length)

            decode = _median_ms(lambda: (e.decode_candidates(pairs), rewind()), args.reps)
            rows.append({"step": "decode", "generating": n, "tokens": n, "ms": decode, "ratio_to_decode": 1.0})
            for t in sizes:
                if t <= n:
                    continue
                start = e.sequence_length(reader)
                parts = [(s, [7]) for s in range(n)] + [(reader, [5 + i % 100 for i in range(t - n)])]
                ms = _median_ms(lambda: (e.mixed(parts, top=True), rewind(), e.reset(reader, start)), args.reps)
                rows.append({"step": "mixed", "generating": n, "tokens": t, "ms": ms, "ratio_to_decode": ms / decode})
    for r in rows:
        r["ms_per_token"] = r["ms"] / r["tokens"]
    return rows


if __name__ == "__main__":
    sys.exit(main())
