"""Layer split over several Vulkan devices (-sm layer) next to one device and next to llama.cpp's
`-sm layer --device ...`, in one run: prompt processing with one micro-batch and with several
(pipelined across the devices in vkrt) and generation, as t/s and ratios.

    python bench/multi_gpu.py MODEL.gguf --device 0,1 [-ts 1,1] [--ncmoe N] [--no-mmap]
        [--tests pp2048@ub512,pp2048@ub2048,tg128] [-r 3] [--llama-server PATH] [--json]

--device 0,0 splits over two logical devices of one GPU (llama.cpp cannot open one GPU twice, so
its side then runs on one device only). MODEL may be a shape name of bench/make_moe_model.py
(qwen3-30b-a3b, qwen35-35b-a3b) to write a random-weight model of that shape first (Q4_0).
Set VKRT_ARCH=gcn for the Polaris-class configuration (llama.cpp then gets the matching
GGML_VK_DISABLE_* variables).

    python bench/multi_gpu.py MODEL.gguf --device 0,1 --slots 1,4,8,16 [--slot-prompt 512] [--steps 32]

--slots: a server's decode steps instead: N sequences (each with a prompt of --slot-prompt tokens)
decoding one token each a step, with the GPU's top-k candidates as the server reads them; t/s of
the steps on one device, on the split run stage after stage, and on the split with
pipeline_steps (the step's sequences in as many groups as devices, pipelined), and whether the
pipelined candidates are the unpipelined ones bit for bit; with each step's milliseconds (JSON:
ms_per_step, host_ms_per_step: the host's share, not waiting for the GPU) and the graphs the
timed steps recorded (graphs_recorded_timed: 0 unless a step's shape was new). --device 0 alone
runs the one-device row only.

--set FIELD=VALUE (repeatable) overrides a tuning field of every device, e.g. --set
mv_id_max_n=8 for mul_mat_id's GEMM past 8 tokens (before vkrt issue 16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from common import bench_settings
from llama_peer import POLARIS_ENV, LlamaServer, find_server
from vkrt.device.group import DeviceGroup
from vkrt.engine.bench import BenchTest, run_test
from vkrt.engine.engine import Engine
from vkrt.engine.generate import random_tokens
from vkrt.engine.options import EngineOptions, plan_layer_split
from vkrt.model.loader import Model


def parse_tests(text: str) -> list[tuple[str, int, int, int]]:
    """pp2048@ub512,tg128 -> (name, prompt tokens, generated tokens, -ub)."""
    out = []
    for item in filter(None, text.split(",")):
        kind, _, ub = item.partition("@ub")
        n = int(kind[2:])
        out.append((item, n if kind.startswith("pp") else 0, n if kind.startswith("tg") else 0, int(ub or 512)))
    return out


def vkrt_side(devices, path, tests, reps, split: bool, ts, ncmoe, mmap) -> dict:
    """t/s of each test on devices[0] alone, or split by layers over all of them."""
    out = {}
    n_ctx = max(t[1] + t[2] for t in tests) + 256
    for ub in sorted({t[3] for t in tests}):
        opts = EngineOptions(n_ctx=n_ctx, n_batch=max(ub, 2048), n_ubatch=ub, n_cpu_moe=ncmoe, tensor_split=ts,
                             mmap=mmap, progress=False)
        layer_split = None
        if split:
            layer_split, _ = plan_layer_split(list(devices), path, opts, opts.budgets(len(devices)))
            out["plan"] = layer_split.describe()
        device = layer_split.main if layer_split else devices[0]
        with Model(device, path, mmap=mmap, n_cpu_moe=ncmoe, progress=False, split=layer_split) as m, \
                Engine(m, n_ctx=n_ctx, n_batch=opts.n_batch, n_ubatch=ub) as e:
            for name, n_p, n_g, u in tests:
                if u == ub:
                    out[name] = run_test(e, BenchTest(n_p, n_g), reps).avg_ts
    return out


def slots_side(devices, path, slots: list[int], n_prompt: int, steps: int, reps: int, split: bool,
               pipelined: bool, ts, ncmoe, mmap) -> dict:
    """t/s of decode steps of N sequences at once (each N of `slots`) on devices[0] alone or split
    by layers over all of them (pipelined: Engine(pipeline_steps=True)); also each first
    step's candidates, to compare."""
    out, first = {}, {}
    rng = np.random.default_rng(1)
    ctx = {n: n * (n_prompt + steps * (reps + 1) + 16) + 256 for n in slots}
    top = max(slots)   # the split is planned (and the model opened) once, for the most slots
    opts = EngineOptions(n_ctx=ctx[top], n_ubatch=max(top, 512), n_cpu_moe=ncmoe, tensor_split=ts, mmap=mmap,
                         n_seq_max=top, progress=False)
    layer_split = plan_layer_split(list(devices), path, opts, opts.budgets(len(devices)))[0] if split else None
    if layer_split:
        out["plan"] = layer_split.describe()
    device = layer_split.main if layer_split else devices[0]
    with Model(device, path, mmap=mmap, n_cpu_moe=ncmoe, progress=False, split=layer_split) as m:
        vocab = m.cfg.vocab_size
        for n in slots:
            with Engine(m, n_ctx=ctx[n], n_ubatch=max(n, 512), n_seq_max=n, pipeline_steps=pipelined) as e:
                for s in range(n):
                    e.eval(random_tokens(n_prompt, vocab, s), seq_id=s)

                def step():
                    batch = [(s, int(t)) for s, t in enumerate(rng.integers(0, vocab, n))]
                    return e.decode_candidates(batch) if n <= e.candidate_rows else (e.decode(batch), None)

                first[n] = step()   # records the step's graphs
                samples, recorded = [], e.stats.graphs_recorded
                host0, steps0 = e.stats.seconds - e.stats.gpu_wait_seconds, e.stats.steps
                for _ in range(reps):
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        step()
                    samples.append((time.perf_counter() - t0) / steps)
                seconds = statistics.median(samples)
                out[f"{n} slots"] = n / seconds
                out[f"{n} slots ms_per_step"] = seconds * 1e3
                out[f"{n} slots host_ms_per_step"] = 1e3 * (e.stats.seconds - e.stats.gpu_wait_seconds - host0) \
                    / (e.stats.steps - steps0)
                out[f"{n} slots graphs_recorded_timed"] = e.stats.graphs_recorded - recorded
    return out, first


def llama_side(binary, path, tests, reps, env, device_args, ncmoe, mmap) -> dict:
    out = {}
    n_ctx = max(t[1] + t[2] for t in tests) + 256
    prompt = random_tokens(n_ctx - 256, 200, 1)
    extra = (["--n-cpu-moe", str(ncmoe)] if ncmoe else []) + ([] if mmap else ["--no-mmap"])
    for ub in sorted({t[3] for t in tests}):
        args = ["-ngl", "99", "-c", str(n_ctx), "-b", str(max(ub, 2048)), "-ub", str(ub), "-fa", "on", "--no-warmup",
                *device_args, *extra]
        try:
            with LlamaServer(binary, path, args, env) as srv:
                srv.completion(prompt[:64], 4)
                for name, n_p, n_g, u in tests:
                    if u != ub:
                        continue
                    if n_p:
                        out[name] = statistics.median(srv.completion(prompt[:n_p], 1)["prompt_per_second"]
                                                      for _ in range(reps))
                    else:
                        out[name] = statistics.median(srv.completion(prompt[:16], n_g)["predicted_per_second"]
                                                      for _ in range(reps))
        except (RuntimeError, OSError) as exc:
            out["error"] = str(exc).splitlines()[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="0,1", help="vkrt's --device list (default 0,1)")
    ap.add_argument("-ts", "--tensor-split", default=None, help="e.g. 1,1 (default: by free VRAM)")
    ap.add_argument("--ncmoe", type=int, default=0, help="--n-cpu-moe for both")
    ap.add_argument("--no-mmap", action="store_true")
    ap.add_argument("--tests", default="pp2048@ub512,pp2048@ub2048,tg128")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--no-llama", action="store_true", help="vkrt only")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--slots", default=None, help="decode steps of N sequences instead, e.g. 1,4,8,16")
    ap.add_argument("--slot-prompt", type=int, default=512, help="--slots: prompt tokens of each sequence")
    ap.add_argument("--steps", type=int, default=32, help="--slots: decode steps a repetition")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a tuning field of every device (repeatable)")
    args = ap.parse_args()
    tests = parse_tests(args.tests)
    ts = tuple(float(v) for v in args.tensor_split.split(",")) if args.tensor_split else None
    path = args.model
    if not os.path.exists(path):   # a shape name: write a random-weight model of that shape
        from make_moe_model import SHAPES
        from vkrt.model.synthetic import write_model
        make, layers = SHAPES[path]
        path = os.path.join(tempfile.mkdtemp(), f"{args.model}.gguf")
        write_model(path, make(layers, "Q4_0"))
    specs = [s.strip() for s in args.device.split(",")]
    if args.slots:
        slots_main(args, path, specs, ts)
        return
    polaris = os.environ.get("VKRT_ARCH", "").lower() in ("gcn", "amd_gcn", "polaris")
    rows = {}
    with DeviceGroup(specs, settings=bench_settings(args.set)) as group:
        physical = [d.profile.index for d in group]
        names = [d.profile.name for d in group]
        rows["vkrt one device"] = vkrt_side(group.devices[:1], path, tests, args.reps, False, None, args.ncmoe,
                                            not args.no_mmap)
        rows["vkrt -sm layer"] = vkrt_side(list(group), path, tests, args.reps, True, ts, args.ncmoe, not args.no_mmap)
    binary = None if args.no_llama else find_server(args.llama_server)
    distinct = list(dict.fromkeys(physical))
    if binary:
        env = {**(POLARIS_ENV if polaris else {}), "GGML_VK_VISIBLE_DEVICES": ",".join(map(str, distinct))}
        rows["llama.cpp one device"] = llama_side(binary, path, tests, args.reps, env,
                                                  ["-sm", "none", "--device", "Vulkan0"], args.ncmoe, not args.no_mmap)
        if len(distinct) > 1:
            split_args = ["-sm", "layer", "--device", ",".join(f"Vulkan{k}" for k in range(len(distinct)))]
            if ts and len(ts) == len(distinct):
                split_args += ["-ts", ",".join(f"{v:g}" for v in ts)]
            rows["llama.cpp -sm layer"] = llama_side(binary, path, tests, args.reps, env, split_args, args.ncmoe,
                                                     not args.no_mmap)
    ratios = {}
    for name, *_ in tests:
        one, split = rows["vkrt one device"].get(name), rows["vkrt -sm layer"].get(name)
        ratios[name] = {"vkrt split / one": split / one if one and split else None}
        peer = rows.get("llama.cpp -sm layer", rows.get("llama.cpp one device", {})).get(name)
        ratios[name]["vkrt split / llama.cpp split" if "llama.cpp -sm layer" in rows else
                     "vkrt split / llama.cpp one device"] = split / peer if peer and split else None
    result = {"model": args.model, "devices": [f"{p}: {n}" for p, n in zip(physical, names)], "device_list": specs,
              "logical_on_one_gpu": len(distinct) < len(physical), "polaris_class": polaris, "tests": [t[0] for t in tests],
              "rows": rows, "ratios": ratios}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.model} over --device {args.device} ({'; '.join(result['devices'])})"
          f"{' - logical devices of one GPU' if result['logical_on_one_gpu'] else ''}"
          f"{' - Polaris-class configuration' if polaris else ''}, t/s")
    if "plan" in rows["vkrt -sm layer"]:
        print(f"vkrt plan: {rows['vkrt -sm layer']['plan']}")
    cols = list(rows)
    print("| test | " + " | ".join(cols) + " | " + " | ".join(next(iter(ratios.values()))) + " |")
    print("|---|" + "---:|" * (len(cols) + len(next(iter(ratios.values())))))
    for name, *_ in tests:
        vals = [rows[c].get(name) for c in cols]
        rs = list(ratios[name].values())
        print(f"| {name} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in vals) + " | "
              + " | ".join("-" if r is None else f"{r:.2f}" for r in rs) + " |")
    for c in cols:
        if "error" in rows[c]:
            print(f"{c} failed: {rows[c]['error']}")


def slots_main(args, path, specs, ts) -> None:
    """--slots: decode steps of N sequences on one device, the split, the pipelined split (the
    split rows where --device names several)."""
    slots = [int(v) for v in args.slots.split(",")]
    rows, first = {}, {}
    with DeviceGroup(specs, settings=bench_settings(args.set)) as group:
        names = [f"{d.profile.index}: {d.profile.name}" for d in group]
        configs = [("vkrt one device", group.devices[:1], False, False)]
        if len(group.devices) > 1:
            configs += [("vkrt -sm layer", list(group), True, False),
                        ("vkrt -sm layer, pipelined steps", list(group), True, True)]
        for name, devs, split, pipelined in configs:
            rows[name], first[name] = slots_side(devs, path, slots, args.slot_prompt, args.steps, args.reps, split,
                                                 pipelined, ts, args.ncmoe, not args.no_mmap)
    split = len(rows) > 1
    same = {n: all(np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
                   for a, b in zip(first["vkrt -sm layer"][n], first["vkrt -sm layer, pipelined steps"][n])
                   if a is not None)
            for n in slots} if split else None
    per_step = {key: {c: {n: rows[c][f"{n} slots {key}"] for n in slots} for c in rows}
                for key in ("ms_per_step", "host_ms_per_step", "graphs_recorded_timed")}
    result = {"model": args.model, "devices": names, "device_list": specs, "slot_prompt": args.slot_prompt,
              "steps": args.steps, "tuning_set": args.set, "rows": rows, **per_step, "pipelined_bit_identical": same}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.model} over --device {args.device} ({'; '.join(names)}): decode steps of N sequences "
          f"(prompts of {args.slot_prompt}), t/s and ms a step (host ms of it)"
          + (f", tuning {' '.join(args.set)}" if args.set else ""))
    if "plan" in rows.get("vkrt -sm layer", {}):
        print(f"vkrt plan: {rows['vkrt -sm layer']['plan']}")
    cols = list(rows)
    extra = " pipelined / split | split / one | pipelined = split, bit for bit |" if split else ""
    print("| slots | " + " | ".join(f"{c} t/s | {c} ms/step" for c in cols) + " | graphs recorded while timed |"
          + extra)
    print("|---|" + "---:|---:|" * len(cols) + "---:|" + ("---:|---:|---|" if split else ""))
    for n in slots:
        cells = " | ".join(f"{rows[c][f'{n} slots']:.1f} | {rows[c][f'{n} slots ms_per_step']:.2f} "
                           f"({rows[c][f'{n} slots host_ms_per_step']:.2f})" for c in cols)
        line = f"| {n} | {cells} | {sum(rows[c][f'{n} slots graphs_recorded_timed'] for c in cols)} |"
        if split:
            one, sp, pipe = (rows[c][f"{n} slots"] for c in cols)
            line += f" {pipe / sp:.2f} | {sp / one:.2f} | {'yes' if same[n] else 'NO'} |"
        print(line)


if __name__ == "__main__":
    main()
