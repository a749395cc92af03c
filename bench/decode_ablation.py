"""What each kernel costs inside a real decode step: the step is recorded again without one kind
of command at a time, replayed, and the wall time it saves is that kind's cost. Unlike
decode_profile.py's timestamp after every command (which serialises the step), this keeps the
overlap the GPU finds between commands with no barrier between them, so the savings are what
removing or fusing that kernel could win. The results of an ablated step are wrong; only its
time is used.

    python bench/decode_ablation.py MODEL.gguf [--depth 32] [--reps 50] [--min-share 1] [--json]

Rows: the full step, the step with no barriers (what the barriers cost), the step with no
dispatches (submission and the empty command buffer), then each kernel kind (part: kernel)
whose removal saves at least --min-share percent, biggest first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from decode_profile import add_step_arguments, decode_step

from vkrt.commands import CommandSequence


def kind_of(part: str, label: str) -> str:
    return f"{part.rstrip('0123456789 ')}: {' '.join(w for w in label.split() if not w.isdigit())}"


def recorded(dev, parts, drop=lambda kind: False, barriers=True) -> CommandSequence:
    """The step's commands in one sequence, without the dispatches whose kind `drop` names."""
    seq = CommandSequence(dev, label="decode ablation")
    dispatch, part_name = seq.dispatch, [""]
    kinds: dict[str, int] = {}

    def filtered(kernel, buffers, push=None, groups=(1, 1, 1), label=None):
        kind = kind_of(part_name[0], label or kernel.label)
        kinds[kind] = kinds.get(kind, 0) + 1
        if not drop(kind):
            dispatch(kernel, buffers, push, groups, label)

    seq.dispatch = filtered
    if not barriers:
        seq.barrier = lambda: None
    with seq.record():
        for part in parts():
            part_name[0] = part.name
            part.record(seq)
    seq.kinds = kinds
    return seq


def step_time(seq: CommandSequence, reps: int) -> float:
    seq.run()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        seq.run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(ap)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--min-share", type=float, default=1.0, help="percent of the step a kind must save to be listed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    with decode_step(args) as (dev, m, e, parts, wall):
        def measure(**how):
            with recorded(dev, parts, **how) as seq:
                t = step_time(seq, args.reps)
                return t, seq.kinds, seq.dispatch_count, seq.barrier_count

        full, kinds, n_dispatch, n_barrier = measure()
        for name, how in (("no barriers", {"barriers": False}), ("no dispatches", {"drop": lambda k: True})):
            t, _, nd, nb = measure(**how)
            rows.append({"without": name, "us_per_step": t * 1e6, "saves_us": (full - t) * 1e6,
                         "dispatches": nd, "barriers": nb})
        for kind in sorted(kinds):
            t, _, nd, nb = measure(drop=lambda k, kind=kind: k == kind)
            rows.append({"without": kind, "us_per_step": t * 1e6, "saves_us": (full - t) * 1e6,
                         "dispatches": nd, "barriers": nb, "count": kinds[kind]})
        info = {**dev.identity(), "model": args.model, "tokens": args.tokens, "depth": args.depth,
                "full_us_per_step": full * 1e6, "engine_wall_us_per_step": wall * 1e6,
                "dispatches": n_dispatch, "barriers": n_barrier}
    shown = rows[:2] + sorted((r for r in rows[2:] if 100 * r["saves_us"] / info["full_us_per_step"] >= args.min_share),
                              key=lambda r: -r["saves_us"])
    if args.json:
        print(json.dumps({**info, "ablations": rows}))
        return 0
    print(f"# {info['device']} ({info['architecture']}), {args.tokens} token(s) at depth {args.depth}: "
          f"step {info['full_us_per_step']:.0f} us replayed ({n_dispatch} dispatches, {n_barrier} barriers), "
          f"engine {info['engine_wall_us_per_step']:.0f} us per decode step")
    print("| without | count | us/step | saves us | saves % |")
    print("|---|---:|---:|---:|---:|")
    for r in shown:
        print(f"| {r['without']} | {r.get('count', '')} | {r['us_per_step']:.0f} | {r['saves_us']:.0f} | "
              f"{100 * r['saves_us'] / info['full_us_per_step']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
