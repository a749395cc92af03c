"""Tuning variants against the table on this card, in one run: each side (the table, then every
--variant of VKRT_TUNE items) opens its own device, loads the model and runs the tests; t/s and
each variant's ratio to the table.

    python bench/tune_ab.py MODEL.gguf [--variant "fa_loads_first=3"] ... [--tests tg128,tg128@d16384]
                            [-ctk q8_0 -ctv q8_0] [-r 3] [--rounds 1] [--json]

Without --variant: the variants docs/kernels.md's "Trying a kernel variant on your card" lists whose
effect these tests see (the GCN table leaves them out because the H200 ran them slower or never
ran them; an RX 580 decides). The several-column server kernels (`mv_rows_multi=2`) need
several slots: `bench/server_steps.py --set`. --rounds N runs every side N times in turn and
reports medians with their range. VKRT_TUNE in the environment applies to every side (the
table's too); a variant's items win over it. Tests as bench/peer.py names them; -ctk / -ctv give
every side that K / V cache type (the quantised caches' variants: fa_loads_first_by_type).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import peer
from common import bench_settings

from vkrt.device import Device
from vkrt.errors import VkrtError

VARIANTS = ("fa_loads_first=3 fa_prologue_pack_rows_by_head=none", "fa_pack_rows=2", "mv_rows_one_column_by_type=Q2_K:2+Q3_K:1+Q4_K:2",
            "mv_lanes_threads=36864", "fa_dot_scatter=1")


def side(path: str, sets: list[str], reps: int, kv=("f16", "f16")) -> dict:
    """t/s of peer.TESTS on a device tuned with `sets` (K and V cache types `kv`), and the
    device's identity ({"error": why} where it refuses them)."""
    try:
        with Device(settings=bench_settings(sets)) as dev:
            return {"identity": dev.identity(), **peer.vkrt_side(dev, path, reps, kv)}
    except VkrtError as exc:
        return {"error": str(exc)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--variant", action="append", default=None, metavar="ITEMS",
                    help="VKRT_TUNE items, e.g. 'fa_loads_first=3' (repeatable; default: docs/kernels.md's list)")
    ap.add_argument("--tests", default="tg128,tg128@d16384", help="of " + ", ".join(t[0] for t in peer.ALL_TESTS))
    ap.add_argument("-ctk", "--cache-type-k", default="f16", help=f"K cache type: {', '.join(peer.KV_TYPES)}")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", help="V cache type")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    names = args.tests.split(",")
    unknown = sorted(set(names) - {t[0] for t in peer.ALL_TESTS})
    if unknown or args.rounds < 1 or args.reps < 1:
        ap.error(f"unknown tests {', '.join(unknown)}" if unknown else "--rounds and --reps must be at least 1")
    try:
        kv = (*peer.kv_types(args.cache_type_k, "-ctk"), *peer.kv_types(args.cache_type_v, "-ctv"))
    except ValueError as exc:
        ap.error(str(exc))
    if len(kv) != 2:
        ap.error("-ctk and -ctv take one type each")
    peer.TESTS = tuple(t for t in peer.ALL_TESTS if t[0] in names)
    sides = [("table", [])] + [(v, v.split()) for v in (args.variant or VARIANTS)]
    runs = [[side(args.model, sets, args.reps, kv) for _, sets in sides] for _ in range(args.rounds)]
    rows = []
    for i, (label, _) in enumerate(sides):
        per_round = [r[i] for r in runs]
        row = {"variant": label, "tune": per_round[0].get("identity", {}).get("tune", "")}
        errors = [r["error"] for r in per_round if "error" in r]
        if errors:
            row["error"] = errors[0]
        for name in names:
            values = [r[name] for r in per_round if name in r]
            if values:
                row[name] = statistics.median(values)
                row[name + "_range"] = (min(values), max(values))
        rows.append(row)
    table = rows[0]
    for row in rows[1:]:
        row["ratio_vs_table"] = {n: row[n] / table[n] for n in names if row.get(n) and table.get(n)}
    if "error" in runs[0][0]:   # the table's own device: the environment's settings refused
        sys.exit(f"tune_ab: {runs[0][0]['error']}")
    identity = runs[0][0]["identity"]
    if args.json:
        print(json.dumps({**identity, "model": args.model, "type_k": kv[0], "type_v": kv[1], "rounds": args.rounds,
                          "rows": rows}))
        return 0
    print(f"tuning variants against the table on {identity['device']} ({identity['architecture']} tuning, "
          f"K/V {kv[0]}/{kv[1]}"
          + (f", VKRT_TUNE {identity['tune']!r} on every side" if "tune" in identity else "") + "), t/s"
          + (f", medians of {args.rounds} rounds in turn" if args.rounds > 1 else ""))
    print("| variant | " + " | ".join(f"{n} | ratio" for n in names) + " |")
    print("|---|" + "---:|---:|" * len(names))
    for row in rows:
        if "error" in row:
            print(f"| {row['variant']} | refused: {row['error']} |")
            continue
        cells = [f"{row[n]:.1f} | {row.get('ratio_vs_table', {}).get(n, 1.0):.3f}" if n in row else "– | –"
                 for n in names]
        print(f"| {row['variant']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
