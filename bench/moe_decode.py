"""Decode through host-resident experts: the chosen experts of a MoE layer read in place by the
mat-vecs, or staged into VRAM slots first, next to a plain buffer copy of the same bytes.

    python bench/moe_decode.py [--types Q4_0,Q4_K] [--layers 8] [--tokens 1] [--reps 5]
                               [--set mv_rows=4 ...] [--json]

Per type, `--layers` layers of Qwen3-30B-A3B's expert stacks (gate and up 2048x768, down
768x2048, 128 experts, 8 used per token) live in imported host memory (distinct memory per
layer, so no cache holds them). One recorded sequence runs every layer's gate, up and down
mul_mat_id for `--tokens` tokens with routing drawn at random:
- in place: the mat-vecs read the experts over the link;
- staged: plan + one copy per stack into device slots, then the mat-vecs read VRAM;
- copy peer: vkCmdCopyBuffer of the same experts (one region each) into VRAM, the link's rate
  for these bytes through the copy path;
- vram: the stacks in device memory (the bound without the link);
- cache: staged through the per-layer expert cache of --cache-slots slots, over --cache-steps
  decode steps of fresh uniform routing per layer (a trained model's router is closer to
  uniform than a random-weight model's); reported with the cache's measured hit rate.
Rates are bytes of the chosen experts per second of GPU time (timestamps, median of --reps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np
from common import bench_settings
from matmul import SCALES

from vkrt.commands import CommandSequence, tensor_from_numpy
from vkrt.device import Device
from vkrt.memory import Buffer, I32, MemoryKind, Tensor, ggml_type
from vkrt.memory.anonymous import AnonymousMemory
from vkrt.memory.imported import ImportedBuffer
from vkrt.commands import read_tensor
from vkrt.ops.moe_stage import (cache_counts, cache_state_words, initial_cache_state, moe_stage_copy, moe_stage_plan,
                                plan_words)
from vkrt.ops.mul_mat_id import mul_mat_id

SHAPES = {"gate": (2048, 768), "up": (2048, 768), "down": (768, 2048)}
N_EXPERT, N_USED = 128, 8


def fill_random(array: np.ndarray, typ, rng) -> None:
    """Random blocks with small finite scales, written by repeating one random 16 MiB piece."""
    t = ggml_type(typ)
    piece = rng.integers(0, 256, (16 << 20) // t.type_size * t.type_size, dtype=np.uint8)
    blocks = piece.reshape(-1, t.type_size)
    for off in SCALES[typ]:
        blocks[:, off:off + 2] = rng.uniform(-1e-3, 1e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    for start in range(0, array.size, piece.size):
        n = min(piece.size, array.size - start)
        array[start:start + n] = piece[:n]


class HostLayers:
    """Expert stacks of `layers` layers in one imported host allocation, and the same in VRAM."""

    def __init__(self, dev, typ, layers: int, rng):
        t = ggml_type(typ)
        self.sizes = {r: t.row_bytes(k) * m * N_EXPERT for r, (k, m) in SHAPES.items()}
        per_layer = sum(-(-s // 4096) * 4096 for s in self.sizes.values())
        align = max(dev.profile.host_import_alignment, 4096)
        total = -(-(layers * per_layer) // align) * align
        self.memory = AnonymousMemory(total, label=f"{typ} expert stacks")
        fill_random(self.memory.array, typ, rng)
        self.host = ImportedBuffer(dev, self.memory.address, total, label=f"{typ} expert stacks (imported)")
        self.vram = Buffer(dev, total, MemoryKind.DEVICE, label=f"{typ} expert stacks (VRAM)")
        with CommandSequence(dev) as seq:
            with seq.record():
                seq.copy(self.host.range(), self.vram.range(), total)
            seq.run()
        self.layers = []
        for where in (self.host, self.vram):
            stacks, off = [], 0
            for _ in range(layers):
                layer = {}
                for r, (k, m) in SHAPES.items():
                    layer[r] = Tensor.on(where.range(off, self.sizes[r]), typ, (k, m, N_EXPERT), name=f"{r} experts")
                    off += -(-self.sizes[r] // 4096) * 4096
                stacks.append(layer)
            self.layers.append(stacks)

    def close(self) -> None:
        self.vram.close()
        self.host.close()
        self.memory.close()


def timed(dev, record, reps: int) -> float:
    with CommandSequence(dev, timestamps=True, max_timestamps=1 << 16, label="bench") as seq:
        with seq.record():
            record(seq)
        seq.run()
        times = []
        for _ in range(reps):
            seq.run()
            times.append(seq.gpu_time())
    return statistics.median(times)


def run_type(dev, typ, args, tuning, rng) -> list[dict]:
    L, T = args.layers, args.tokens
    hl = HostLayers(dev, typ, L, rng)
    ids_np = [np.stack([rng.choice(N_EXPERT, N_USED, replace=False) for _ in range(T)]).astype(np.int32)
              for _ in range(L)]
    ids = [tensor_from_numpy(dev, i) for i in ids_np]
    chosen = sum(len(np.unique(i)) for i in ids_np)
    nbytes = chosen * sum(s // N_EXPERT for s in hl.sizes.values())
    x = tensor_from_numpy(dev, rng.standard_normal((T, 1, 2048)).astype(np.float32))
    h = tensor_from_numpy(dev, rng.standard_normal((T, N_USED, 768)).astype(np.float32))
    ys = {r: Tensor.empty(dev, "F32", (m, N_USED, T)) for r, (k, m) in SHAPES.items()}
    slots_n = min(N_EXPERT, N_USED * T)
    slots = {r: Tensor.empty(dev, typ, (k, m, slots_n)) for r, (k, m) in SHAPES.items()}
    remap = Tensor.empty(dev, I32, (N_USED, T))
    plan = Tensor.empty(dev, I32, (plan_words(N_EXPERT),))
    staging = Buffer(dev, nbytes // L + 4096, MemoryKind.DEVICE, label="copy peer destination")

    def matvecs(seq, layer, idt):
        for r in SHAPES:
            mul_mat_id(seq, layer[r], x if r != "down" else h, idt, ys[r], tuning=tuning)

    def in_place(where):
        return lambda seq: [matvecs(seq, hl.layers[where][il], ids[il]) for il in range(L)]

    def staged(seq):
        for il in range(L):
            moe_stage_plan(seq, ids[il], remap, plan, N_EXPERT)
            for r in SHAPES:
                moe_stage_copy(seq, hl.layers[0][il][r], slots[r], plan, slots_n)
            matvecs(seq, slots, remap)

    def copy_peer(seq):
        for il in range(L):
            off = 0
            for r in SHAPES:
                stack = hl.layers[0][il][r]
                per = stack.nb[2]
                for e in np.unique(ids_np[il]):
                    seq.copy(stack.range().sub(int(e) * per, per), staging.range(off, per), per)
                    off += per

    C, steps = args.cache_slots, args.cache_steps
    words = cache_state_words(N_EXPERT, C)
    state = tensor_from_numpy(dev, np.tile(initial_cache_state(N_EXPERT, C), L))
    pool = {r: Tensor.empty(dev, typ, (k, m, L * C + slots_n)) for r, (k, m) in SHAPES.items()}
    step_ids = [[tensor_from_numpy(dev, np.stack([rng.choice(N_EXPERT, N_USED, replace=False) for _ in range(T)])
                                   .astype(np.int32)) for _ in range(L)] for _ in range(steps)]

    def cached(seq):
        for s in range(steps):
            for il in range(L):
                base = il * C
                views = {r: pool[r].slice(2, base, L * C + slots_n) for r in SHAPES}
                moe_stage_plan(seq, step_ids[s][il], remap, plan, N_EXPERT, state=state.slice(0, il * words,
                               (il + 1) * words), cache_slots=C, stage_base=L * C - base)
                for r in SHAPES:
                    moe_stage_copy(seq, hl.layers[0][il][r], views[r], plan, slots_n)
                matvecs(seq, views, remap)

    rows = []
    try:
        times = {"in place": timed(dev, in_place(0), args.reps), "staged": timed(dev, staged, args.reps),
                 "copy peer": timed(dev, copy_peer, args.reps), "vram": timed(dev, in_place(1), args.reps)}
        if C:
            times[f"cache {C}/{N_EXPERT}"] = timed(dev, cached, args.reps) / steps
            counts = np.array([cache_counts(read_tensor(state)[il * words:(il + 1) * words]) for il in range(L)])
            hit_rate = counts[:, 0].sum() / counts.sum()
        for name, t in times.items():
            rows.append({"type": typ, "path": name, "layers": L, "tokens": T, "us_per_layer": t / L * 1e6,
                         "gbps": nbytes / t / 1e9, "speedup_vs_in_place": times["in place"] / t,
                         "of_copy_peer": times["copy peer"] / t})
            if name.startswith("cache"):
                rows[-1]["cache_hit_rate"] = float(hit_rate)
    finally:
        for obj in (x, h, remap, plan, staging, state, *ids, *ys.values(), *slots.values(), *pool.values(),
                    *(t for step in step_ids for t in step)):
            obj.close()
        hl.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_0,Q4_K")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cache-slots", type=int, default=44, help="expert cache slots per layer (0: no cache row)")
    ap.add_argument("--cache-steps", type=int, default=64)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    with Device(settings=bench_settings(args.set)) as dev:
        tuning = dev.tuning
        for typ in args.types.split(","):
            for r in run_type(dev, typ, args, tuning, rng):
                rows.append(r)
                if not args.json:
                    hits = f"  {100 * r['cache_hit_rate']:.0f}% hits" if "cache_hit_rate" in r else ""
                    print(f"{r['type']:5} {r['path']:12} {r['us_per_layer']:9.1f} us/layer {r['gbps']:7.2f} GB/s "
                          f"{r['speedup_vs_in_place']:5.2f}x in place  {100 * r['of_copy_peer']:5.1f}% of copy peer{hits}",
                          flush=True)
        info = {**dev.identity(),
                "tuning": {f: getattr(tuning, f) for f in ("mv_wg", "mv_rows", "mv_max_n")}}
    if args.json:
        print(json.dumps({**info, "results": rows}))
    else:
        print(f"# {info['device']} ({info['architecture']}), tuning {info['tuning']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
