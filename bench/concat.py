"""Concat along dim 0 with a transposed source: fast path vs generic kernel vs a plain copy.

    python bench/concat.py [--rows 4096] [--cols 512 64] [--types f32 f16]
                           [--transposed first|second|both] [--reps 10] [--iters 5] [--json]

dst (rows x (cols_a + cols_b)) = a ++ b along dim 0 (columns), where one source is stored
transposed (`--transposed` names which). Each variant is recorded `--reps` times into one
command sequence and run `--iters` times; the time of one op is the median GPU time between
consecutive timestamps (the first op of each run, which absorbs the start-up, is dropped).
The peer is vkCmdCopyBuffer of dst's bytes (it reads and writes as many bytes as the concat):
fraction_of_copy_bandwidth = copy time / fast-path time. The fast and generic outputs are
compared bit for bit.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from vkrt.commands import CommandSequence, download, tensor_from_numpy
from vkrt.device import Device
from vkrt.memory import Tensor, ggml_type
from vkrt.ops.concat import concat


def op_seconds(seq, iters: int) -> float:
    """Median GPU seconds of one recorded op, over `iters` runs of `seq`."""
    samples = []
    for _ in range(iters):
        seq.run()
        samples += [t for _, t in seq.gpu_times()[1:]]
    return statistics.median(samples)


def measure_case(dev, typ, rows: int, cols: tuple[int, int], transposed: str, reps: int, iters: int) -> dict:
    rng = np.random.default_rng(0)
    ctg_cols, trp_cols = (cols[0], cols[1]) if transposed == "second" else (cols[1], cols[0])
    bits = np.uint32 if typ.type_size == 4 else np.uint16

    def host(shape):
        return rng.integers(0, 1 << (8 * typ.type_size), size=shape, dtype=np.uint64).astype(bits).view(typ.dtype)

    ctg = tensor_from_numpy(dev, host((rows, ctg_cols)), typ=typ, name="contiguous source")
    trp_mem = tensor_from_numpy(dev, host((trp_cols, rows)), typ=typ, name="transposed source")
    trp = trp_mem.transpose()
    a, b = (ctg, trp) if transposed == "second" else (trp, ctg)
    ne = (cols[0] + cols[1], rows)
    outs = {path: Tensor.empty(dev, typ, ne, name=f"dst {path}") for path in ("fast", "generic")}
    copy_src, copy_dst = Tensor.empty(dev, typ, ne, name="copy source"), Tensor.empty(dev, typ, ne, name="copy dst")
    times = {}
    try:
        for path, dst in outs.items():
            with CommandSequence(dev, timestamps=True, label=f"concat {path}") as seq:
                with seq.record():
                    for _ in range(reps):
                        assert concat(seq, a, b, dst, 0, path=path) == path
                times[path] = op_seconds(seq, iters)
        with CommandSequence(dev, timestamps=True, label="copy") as seq:
            with seq.record():
                for _ in range(reps):
                    seq.copy(copy_src.range(), copy_dst.range())
            times["copy"] = op_seconds(seq, iters)
        identical = bool(np.array_equal(download(dev, outs["fast"].range(), np.uint8),
                                        download(dev, outs["generic"].range(), np.uint8)))
    finally:
        for t in (ctg, trp_mem, copy_src, copy_dst, *outs.values()):
            t.close()
    dst_bytes = ne[0] * ne[1] * typ.type_size
    moved = 2 * dst_bytes  # the sources' bytes read + dst's bytes written
    return {
        "type": typ.name.lower(),
        "rows": rows,
        "cols_a": cols[0],
        "cols_b": cols[1],
        "transposed_source": transposed,
        "bytes_moved": moved,
        "generic_us": times["generic"] * 1e6,
        "fast_us": times["fast"] * 1e6,
        "copy_us": times["copy"] * 1e6,
        "generic_gb_per_s": moved / times["generic"] / 1e9,
        "fast_gb_per_s": moved / times["fast"] / 1e9,
        "copy_gb_per_s": moved / times["copy"] / 1e9,
        "speedup_vs_generic": times["generic"] / times["fast"],
        "fraction_of_copy_bandwidth": times["copy"] / times["fast"],
        "fast_equals_generic_bitwise": identical,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096, help="rows of both sources (ne[1])")
    ap.add_argument("--cols", type=int, nargs=2, default=[512, 64], metavar=("A", "B"),
                    help="columns (ne[0]) of source a and source b")
    ap.add_argument("--types", nargs="+", default=["f32", "f16"], choices=["f32", "f16", "i32", "bf16"])
    ap.add_argument("--transposed", choices=["first", "second", "both"], default="both",
                    help="which source is stored transposed")
    ap.add_argument("--reps", type=int, default=10, help="ops recorded into one sequence")
    ap.add_argument("--iters", type=int, default=5, help="runs of each sequence")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    which = ["second", "first"] if args.transposed == "both" else [args.transposed]
    with Device() as dev:
        cases = [measure_case(dev, ggml_type(t), args.rows, tuple(args.cols), w, args.reps, args.iters)
                 for t in args.types for w in which]
        result = {"bench": "concat_transposed_source", **dev.identity(),
                  "transpose_tile": dev.tuning.transpose_tile, "transpose_rows": dev.tuning.transpose_rows, "reps": args.reps, "iters": args.iters,
                  "cases": cases}
    if args.json:
        print(json.dumps(result))
        return
    print(f"concat along dim 0 with a transposed source on {result['device']} ({result['architecture']}, "
          f"tile {result['transpose_tile']}x{result['transpose_rows']}); GPU time per op, median")
    head = ("type", "shape (rows x a + b)", "transposed", "generic us", "fast us", "copy us", "fast GB/s",
            "copy GB/s", "speedup vs generic", "fraction of copy bw", "bitwise equal")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("-" * (len(h) + 2) for h in head) + "|")
    for c in cases:
        shape = f"{c['rows']} x {c['cols_a']} + {c['cols_b']}"
        row = (c["type"], shape, c["transposed_source"], f"{c['generic_us']:.1f}", f"{c['fast_us']:.1f}",
               f"{c['copy_us']:.1f}", f"{c['fast_gb_per_s']:.1f}", f"{c['copy_gb_per_s']:.1f}",
               f"{c['speedup_vs_generic']:.1f}x", f"{100 * c['fraction_of_copy_bandwidth']:.0f}%",
               "yes" if c["fast_equals_generic_bitwise"] else "NO")
        print("| " + " | ".join(v.rjust(len(h)) for v, h in zip(row, head)) + " |")


if __name__ == "__main__":
    main()
