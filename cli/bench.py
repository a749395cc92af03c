"""`vkrt bench`: llama-bench's flags and output formats (md, json, jsonl, csv)."""

from __future__ import annotations

import csv
import datetime
import importlib.util
import io
import itertools
import json
import math
import os
from functools import partial

import click

from vkrt import __version__

from .common import (
    INT32_MAX,
    KV_CACHE_TYPES,
    cache_size,
    count,
    default_model,
    flag01,
    hub_model,
    hub_options,
    open_devices,
    parse_tensor_split,
)

DEFAULTS = dict(n_batch=2048, n_ubatch=512, type_k="f16", type_v="f16", n_gpu_layers=99, flash_attn=False,
                use_mmap=True, n_cpu_moe=0, split_mode="layer", main_gpu=None, tensor_split=None, cpu_experts="auto",
                cpu_moe_threads=None, link_gbps=None)
COLUMN_NAMES = dict(n_batch="n_batch", n_ubatch="n_ubatch", type_k="type_k", type_v="type_v", flash_attn="fa",
                    use_mmap="mmap", n_cpu_moe="n_cpu_moe", split_mode="sm", main_gpu="mg", tensor_split="ts",
                    cpu_experts="cpu_experts", cpu_moe_threads="moe_threads", link_gbps="link GB/s")
MAX_RANGE = 4096   # values an a-b range of counts may hold
TRAFFIC_COLUMNS = ("experts % cache/copy/cpu", "MB/tok")   # tg rows: where the experts ran, bus bytes a token


def _ints(text: str, what: str) -> list[int]:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if "-" in part[1:] and "*" not in part:  # a-b range as llama-bench allows (step 1)
            a, b = part.split("-", 1)
            try:
                first, last = int(a), int(b)
            except ValueError:
                raise click.BadParameter(f"{what}: {part!r} is not a range of integers") from None
            if last - first >= MAX_RANGE:
                raise click.BadParameter(f"{what}: {part!r} spans more than {MAX_RANGE} values")
            out.extend(range(first, last + 1))
        elif part:
            try:
                out.append(int(part))
            except ValueError:
                raise click.BadParameter(f"{what}: {part!r} is not an integer") from None
    if any(v < 0 for v in out):
        raise click.BadParameter(f"{what}: {text!r} holds a negative count; sizes are 0 or more")
    if any(v > INT32_MAX for v in out):
        raise click.BadParameter(f"{what}: {text!r} holds a count over {INT32_MAX}")
    return out


def _pairs(values: tuple[str, ...]) -> list[tuple[int, int]]:
    out = []
    for v in values:
        for item in v.split(";") if ";" in v else [v]:
            nums = _ints(item, "-pg")
            if len(nums) != 2:
                raise click.BadParameter(f"-pg takes pp,tg pairs, got {item!r}")
            out.append((nums[0], nums[1]))
    return out


def _words(text: str, what: str, allowed: tuple[str, ...]) -> list[str]:
    out = [w.strip() for w in str(text).split(",") if w.strip()]
    for w in out:
        if w not in allowed:
            raise click.BadParameter(f"{what}: {w!r} is not one of {', '.join(allowed)}")
    return out


def _kv_types(text: str, what: str) -> list[str]:
    """-ctk / -ctv: KV cache type names, comma-separated, any case (at least one)."""
    out = []
    for w in (w.strip() for w in str(text).split(",")):
        if w.lower() not in KV_CACHE_TYPES:
            raise click.BadParameter(f"{what}: {w!r} is not a KV cache type; choose from {', '.join(KV_CACHE_TYPES)}")
        out.append(w.lower())
    return out


def _counts(text: str, what: str) -> list[int]:
    """A list of counts of at least 1 (threads)."""
    out = _ints(text, what)
    if 0 in out:
        raise click.BadParameter(f"{what}: {text!r} holds 0; give at least 1")
    return out


def _rates(text: str, what: str) -> list[float]:
    """A list of positive GB/s figures."""
    out = []
    for part in (p.strip() for p in str(text).split(",")):
        try:
            value = float(part)
        except ValueError:
            raise click.BadParameter(f"{what}: {part!r} is not a number of GB/s") from None
        if not 0 < value < math.inf:
            raise click.BadParameter(f"{what}: {part!r}: the rate must be more than 0 GB/s and finite")
        out.append(value)
    return out


def _fmt_split(ts) -> str:
    return "0.00" if ts is None else "/".join(f"{v:g}" for v in ts)


def _model_desc(model) -> str:
    meta = model.gguf.metadata
    size = meta.get("general.size_label") or f"{model.n_params / 1e6:.0f}M"
    ftype = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
             11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium",
             16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 32: "BF16"}.get(meta.get("general.file_type"), "?")
    return f"{model.cfg.arch} {size} {ftype}"


def _fmt_size(n: int) -> str:
    return f"{n / 1024 ** 3:.2f} GiB" if n >= 1024 ** 3 else f"{n / 1024 ** 2:.2f} MiB"


def _fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


@click.command()
@click.option("-m", "--model", "models", multiple=True, help="GGUF model(s); comma-separated or repeated.")
@partial(hub_options, multiple=True)
@click.option("-p", "--n-prompt", "n_prompt", default="512", show_default=True, help="Prompt sizes (pp tests).")
@click.option("-n", "--n-gen", "n_gen", default="128", show_default=True, help="Generation lengths (tg tests).")
@click.option("-pg", "pg", multiple=True, help="pp,tg pairs (combined test).")
@click.option("-d", "--n-depth", "n_depth", default="0", show_default=True, help="KV depths to test at.")
@click.option("-b", "--batch-size", "n_batch", default="2048", show_default=True)
@click.option("-ub", "--ub", "--ubatch-size", "n_ubatch", default="512", show_default=True)
@click.option("-ngl", "--n-gpu-layers", "n_gpu_layers", default="99", show_default=True)
@click.option("-ctk", "--cache-type-k", "cache_type_k", default="f16", show_default=True,
              help=f"K cache types, comma-separated (each is run): {', '.join(KV_CACHE_TYPES)}.")
@click.option("-ctv", "--cache-type-v", "cache_type_v", default="f16", show_default=True,
              help="V cache types, as -ctk. Rows with a quantised K or V run with flash attention (unless -fa 0 is "
                   "given: refused), the only attention that reads one.")
@click.option("-fa", "--flash-attn", "flash_attn", default="0", show_default=True)
@click.option("-mmp", "--mmap", "mmap", default="1", show_default=True, help="Memory-map the model (0 = --no-mmap).")
@click.option("--no-mmap", is_flag=True, help="Same as -mmp 0.")
@click.option("-ncmoe", "--n-cpu-moe", "n_cpu_moe", default="0", show_default=True,
              help="Keep the expert tensors of the first N layers in host memory (MoE models).")
@click.option("--expert-cache", default="auto", show_default=True,
              help="VRAM for caching host-resident experts during decode (a size, auto, or 0 = off).")
@click.option("-dev", "--device", "device", default=None, metavar="DEV0/DEV1/...",
              help="Devices (indices or name substrings, '/'-separated as llama-bench's; a repeated index opens "
                   "several logical devices on one GPU); default: one device.")
@click.option("-sm", "--split-mode", "split_mode", default="layer", show_default=True,
              help="none or layer (comma-separated to test several).")
@click.option("-mg", "--main-gpu", "main_gpu", default=None,
              help="Device holding the output (index into -dev; default: the last with -sm layer, else 0).")
@click.option("-ts", "--tensor-split", "tensor_split", default=None, metavar="TS0/TS1/...",
              help="Share of the layers each device runs, '/'-separated (default: by free VRAM).")
@click.option("--cpu-experts", "cpu_experts", default=None, metavar="off|auto|all",
              help="Host-resident experts not in the expert cache: off = copied to the GPU, all = on the CPU, auto = "
                   "where the measured rates say is cheaper (comma-separated to test several; default auto).")
@click.option("--cpu-moe-threads", "cpu_moe_threads", default=None, metavar="N",
              help="Threads of the CPU expert kernels (comma-separated to test several; default: the CPU's cores).")
@click.option("--link-bandwidth", "link_bandwidth", default=None, metavar="GB/s",
              help="Pace host-to-device expert traffic to this rate, as a slower PCIe link would (comma-separated to "
                   "test several; default VKRT_LINK_BANDWIDTH, else unpaced).")
@click.option("--spec-type", "spec_type", default=None, metavar="ngram|draft",
              help="Also run copy{n} tests (greedy generation of -n tokens on a prompt whose answer copies it), "
                   "plain and with this speculative decoding (comma-separated: several); rows report acceptance.")
@click.option("-md", "--model-draft", "model_draft", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Draft model for --spec-type draft.")
@click.option("--draft-max", "draft_max", type=count(1, 256), default=16, show_default=True)
@click.option("--draft-min", "draft_min", type=count(0, 256), default=0, show_default=True)
@click.option("--draft-p-min", "draft_p_min", type=click.FloatRange(0, 1), default=0.75, show_default=True)
@click.option("-r", "--repetitions", type=count(1), default=5, show_default=True)
@click.option("-o", "--output", type=click.Choice(["md", "json", "jsonl", "csv"]), default="md", show_default=True)
def bench(models, hf_repo, hf_file, hf_token, n_prompt, n_gen, pg, n_depth, n_batch, n_ubatch, n_gpu_layers,
          cache_type_k, cache_type_v, flash_attn, mmap, no_mmap, n_cpu_moe, expert_cache, device, split_mode, main_gpu,
          tensor_split, cpu_experts, cpu_moe_threads, link_bandwidth, spec_type, model_draft, draft_max, draft_min,
          draft_p_min, repetitions, output):
    """Benchmark prompt processing and generation (llama-bench compatible)."""
    from vkrt.device.tune import describe_tune
    from vkrt.engine.bench import BenchTest, DepthFill, copy_prompt, run_copy_test, run_test
    from vkrt.engine.drafting import open_drafting
    from vkrt.engine.speculative import SPEC_TYPES, SpecOptions
    from vkrt.engine.engine import Engine
    from vkrt.engine.options import CPU_EXPERTS, EngineOptions, plan_layer_split
    from vkrt.errors import ConfigError
    from vkrt.model.loader import Model

    repos = [r for spec in hf_repo for r in spec.split(",") if r]
    if hf_file and len(repos) != 1:
        raise click.UsageError("--hf-file names a file of the one repository given by -hf REPO")
    paths = [p for m in models for p in m.split(",") if p] + [hub_model(r, hf_file, hf_token) for r in repos]
    paths = paths or [default_model()]
    tests = [BenchTest(p, 0) for p in _ints(n_prompt, "-p") if p] + [BenchTest(0, g) for g in _ints(n_gen, "-n") if g]
    tests += [BenchTest(p, g) for p, g in _pairs(pg)]
    specs = [] if spec_type is None else _words(spec_type, "--spec-type", SPEC_TYPES)
    if "draft" in specs and model_draft is None:
        raise click.UsageError("--spec-type draft needs a draft model: -md FILE")
    if model_draft is not None and "draft" not in specs:
        raise click.UsageError("-md is for --spec-type draft")
    try:
        spec_opts = {t: SpecOptions(t, draft_max=draft_max, draft_min=draft_min, p_min=draft_p_min) for t in specs}
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if specs and not [g for g in _ints(n_gen, "-n") if g]:
        raise click.UsageError("--spec-type runs copy tests of -n tokens: give -n above 0")
    tests += [BenchTest(0, g, spec=sp) for g in _ints(n_gen, "-n") if g for sp in (["plain", *specs] if specs else [])]
    depths = _ints(n_depth, "-d")
    mmaps = [False] if no_mmap else [flag01(v) for v in mmap.split(",")]
    ncmoe = _ints(n_cpu_moe, "-ncmoe")
    cache = cache_size(expert_cache)
    devices = device.replace("/", ",") if device else None
    modes = [m.strip() for m in split_mode.split(",")]
    mgs = [None] if main_gpu is None else _ints(main_gpu, "-mg")
    splits = [None] if tensor_split is None else [parse_tensor_split(v, "/") for v in tensor_split.split(",")]
    host = dict(cpu_experts=["auto"] if cpu_experts is None else _words(cpu_experts, "--cpu-experts", CPU_EXPERTS),
                cpu_moe_threads=[None] if cpu_moe_threads is None else _counts(cpu_moe_threads, "--cpu-moe-threads"),
                link_gbps=[None] if link_bandwidth is None else _rates(link_bandwidth, "--link-bandwidth"))
    kv = list(itertools.product(_kv_types(cache_type_k, "-ctk"), _kv_types(cache_type_v, "-ctv")))
    fas = [flag01(v) for v in flash_attn.split(",")]
    fa_given = click.get_current_context().get_parameter_source("flash_attn") != click.core.ParameterSource.DEFAULT
    kv_fa = _kv_flash_attn(kv, fas, fa_given)
    grid = list(itertools.product(paths, _ints(n_gpu_layers, "-ngl"), mmaps, ncmoe, modes, mgs, splits,
                                  _ints(n_batch, "-b"), _ints(n_ubatch, "-ub"), kv_fa, *host.values()))
    varying = {k for k, vals in dict(n_batch=_ints(n_batch, "-b"), n_ubatch=_ints(n_ubatch, "-ub"),
                                     type_k=[k for k, _ in kv], type_v=[v for _, v in kv],
                                     flash_attn=[fa for _, fa in kv_fa], use_mmap=mmaps,
                                     n_cpu_moe=ncmoe, split_mode=modes, main_gpu=mgs, tensor_split=splits).items()
               if len(set(vals)) > 1 or vals[0] != DEFAULTS[k]}
    varying |= {k for k, given in zip(host, (cpu_experts, cpu_moe_threads, link_bandwidth)) if given is not None}
    traffic = any(ncmoe) and any(not t.n_prompt for t in tests)
    rows = []
    printer = _Printer(output, sorted(varying, key=list(COLUMN_NAMES).index), traffic, spec=bool(specs))
    box_device = None   # a device that ran host-resident experts: the footer gives its rates
    with open_devices(devices) as group:
        loaded = None
        for path, ngl, use_mmap, n_moe, sm, mg, ts, nb, nub, ((type_k, type_v), fa), cpu, threads, link in grid:
            key = (path, ngl, use_mmap, n_moe, sm, mg, ts)
            try:
                opts = EngineOptions(n_gpu_layers=ngl, n_cpu_moe=n_moe, split_mode=sm, main_gpu=mg, tensor_split=ts,
                                     n_ubatch=nub, n_batch=nb, flash_attn=fa, cpu_experts=cpu, cpu_moe_threads=threads,
                                     link_bandwidth=link)
            except ConfigError as exc:
                raise click.UsageError(str(exc)) from None
            if loaded is None or loaded[0] != key:
                if loaded is not None:
                    loaded[1].close()
                    loaded = None
                try:
                    budgets = opts.budgets(len(group))
                    if len(group) > 1 and sm == "layer":
                        split, n_moe = plan_layer_split(list(group), path, opts, budgets)
                        dev = split.main
                    else:
                        split, dev = None, group[opts.main_gpu or 0] if (opts.main_gpu or 0) < len(group) else None
                        if dev is None:
                            raise ConfigError(f"-mg {mg}: -dev gives {len(group)} device(s)")
                except ConfigError as exc:
                    raise click.UsageError(str(exc)) from None
                loaded = (key, Model(dev, path, mmap=use_mmap, n_gpu_layers=ngl, n_cpu_moe=n_moe, progress=False,
                                     split=split))
            model = loaded[1]

            def engine_for(n_ctx: int, verify: int = 0) -> Engine:
                return Engine(model, n_ctx=n_ctx, n_batch=nb, n_ubatch=min(nub, nb), flash_attn=fa,
                              kv_type=type_k.upper(), kv_type_v=type_v.upper(), expert_cache=cache,
                              cpu_experts=cpu, cpu_moe_threads=threads, link_bandwidth=link, verify_tokens=verify)
            # the pp/tg tests share one engine sized for the deepest, and a deeper depth extends the
            # last one (DepthFill); a copy test gets its own, the shared one closed meanwhile
            plain_ctx = max([_context(d, t.n_prompt + t.n_gen) for d in depths for t in tests if t.spec is None],
                            default=0)
            shared, fill = None, DepthFill()
            try:
                for depth in depths:
                    for test in tests:
                        t = BenchTest(test.n_prompt, test.n_gen, depth, test.spec)
                        if t.spec is None:
                            shared = shared or engine_for(plain_ctx)
                            res = run_test(shared, t, repetitions, fill=fill)
                            box_device = model.device if shared.host_experts else box_device
                        else:
                            if shared is not None:
                                shared.close()
                                shared, fill = None, DepthFill()
                            prompt = copy_prompt(model.tokenizer)
                            with engine_for(_context(depth, len(prompt) + t.n_gen),
                                            spec_opts[t.spec].step_tokens() if t.spec in spec_opts else 0) as engine:
                                if t.spec == "plain":
                                    res = run_copy_test(engine, t, repetitions, prompt)
                                else:
                                    try:
                                        drafting = open_drafting(spec_opts[t.spec], model, engine, engine.device,
                                                                 model_draft if t.spec == "draft" else None)
                                    except ConfigError as exc:
                                        raise click.UsageError(str(exc)) from None
                                    with drafting:
                                        res = run_copy_test(engine, t, repetitions, prompt, drafting.speculation)
                                box_device = model.device if engine.host_experts else box_device
                        used = model.split.devices if model.split else [model.device]
                        row = dict(model=model, path=path, ngl=ngl, use_mmap=use_mmap, n_batch=nb, n_ubatch=nub,
                                   type_k=type_k, type_v=type_v, flash_attn=fa, n_cpu_moe=model.n_cpu_moe,
                                   result=res, cpu_experts=cpu, cpu_moe_threads=threads, link_gbps=link,
                                   device=", ".join(d.profile.name for d in used), split_mode=sm,
                                   main_gpu=mg, tensor_split=ts, devices=[d.label for d in used],
                                   tune=describe_tune(model.device.tuning_overrides))
                        rows.append(row)
                        printer.row(row)
            finally:
                if shared is not None:
                    shared.close()
        if loaded is not None:
            loaded[1].close()
        footer = _box_line(box_device) if box_device is not None and output == "md" else None
    printer.done(footer)


def _context(depth: int, tokens: int) -> int:
    """The context a test at `depth` needs for `tokens` more, in whole 256-cell buckets."""
    return max(256, -(-(depth + tokens) // 256) * 256)


def _kv_flash_attn(kv: list[tuple[str, str]], fas: list[bool], fa_given: bool) -> list[tuple[tuple[str, str], bool]]:
    """(K/V types, flash attention) of each run: -ctk x -ctv x -fa, where a quantised K or V takes
    flash attention (the attention that reads one), -fa 0 given with one refused by name."""
    out = []
    for k, v in kv:
        quantised = [t for t in (k, v) if t not in ("f16", "f32")]
        if quantised and fa_given and not all(fas):
            raise click.UsageError(f"-ctk/-ctv {quantised[0]}: a quantised KV cache is read by flash attention "
                                   f"only: drop -fa 0 (or give -fa 1)")
        for fa in ([True] if quantised else fas):
            if ((k, v), fa) not in out:
                out.append(((k, v), fa))
    return out


def _box_line(device) -> str | None:
    """The footer line of vkrt.engine.box_rates (the box's CPU and link rates) for `device`;
    None where this build has no such module."""
    if importlib.util.find_spec("vkrt.engine.box_rates") is None:
        return None
    from vkrt.engine import box_rates
    return box_rates.footer_line(box_rates.box_rates(device))


class _Printer:
    """Writes rows as they come (md, jsonl, csv) or all at the end (json). `traffic`: the md
    table has the columns of where tg rows' experts ran and the bytes that crossed the bus."""

    def __init__(self, fmt: str, extra_cols: list[str], traffic: bool = False, spec: bool = False):
        self.fmt, self.extra, self.traffic, self.spec = fmt, extra_cols, traffic, spec
        self.records: list[dict] = []
        self.header_done = False

    def _record(self, row) -> dict:
        r, m = row["result"], row["model"]
        return {
            "build_commit": "vkrt", "build_number": 0, "vkrt_version": __version__, "cpu_info": "",
            "gpu_info": row["device"], "backends": "Vulkan", "model_filename": row["path"],
            "model_type": _model_desc(m), "model_size": m.size_bytes, "model_n_params": m.n_params,
            "n_batch": row["n_batch"], "n_ubatch": row["n_ubatch"],
            "n_threads": row["cpu_moe_threads"] or os.cpu_count(),
            "type_k": row["type_k"], "type_v": row["type_v"], "n_gpu_layers": row["ngl"],
            "split_mode": row["split_mode"],
            "main_gpu": row["main_gpu"] if row["main_gpu"] is not None else len(row["devices"]) - 1,
            "tensor_split": _fmt_split(row["tensor_split"]), "devices": "/".join(row["devices"]), "no_kv_offload": False,
            "flash_attn": row["flash_attn"], "use_mmap": row["use_mmap"], "n_cpu_moe": row["n_cpu_moe"], "embeddings": False,
            "n_prompt": r.test.n_prompt, "n_gen": r.test.n_gen, "n_depth": r.test.n_depth,
            "test_time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "avg_ns": int(r.avg_ns), "stddev_ns": int(r.stddev_ns), "avg_ts": r.avg_ts, "stddev_ts": r.stddev_ts,
            "samples_ns": r.samples_ns, "samples_ts": r.samples_ts, "vkrt_tune": row["tune"],
            "cpu_experts": row["cpu_experts"], "cpu_moe_threads": row["cpu_moe_threads"], "link_gbps": row["link_gbps"],
            **_traffic_fields(r),
            **({"spec_type": r.test.spec, "draft_n": r.drafted, "draft_n_accepted": r.accepted}
               if r.test.spec is not None else {}),
        }

    def row(self, row) -> None:
        rec = self._record(row)
        self.records.append(rec)
        if self.fmt == "jsonl":
            click.echo(json.dumps(rec))
        elif self.fmt == "csv":
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=list(rec))
            if not self.header_done:
                w.writeheader()
            w.writerow({k: (json.dumps(v) if isinstance(v, list) else v) for k, v in rec.items()})
            click.echo(buf.getvalue(), nl=False)
        elif self.fmt == "md":
            cols = ["model", "size", "params", "backend", "ngl"] + [COLUMN_NAMES[c] for c in self.extra] + ["test", "t/s"]
            cols += list(TRAFFIC_COLUMNS) if self.traffic else []
            cols += ["accepted"] if self.spec else []
            if not self.header_done:
                click.echo("| " + " | ".join(cols) + " |")
                click.echo("| " + " | ".join("---:" if c in ("size", "params", "ngl", "t/s", "test", "accepted", *TRAFFIC_COLUMNS)
                                             or c in COLUMN_NAMES.values() else "---" for c in cols) + " |")
            extra = [str(int(rec[c]) if isinstance(rec[c], bool) else f"{rec[c]:g}" if isinstance(rec[c], float)
                         else rec[c]) for c in self.extra]
            r = row["result"]
            vals = [rec["model_type"], _fmt_size(rec["model_size"]), _fmt_params(rec["model_n_params"]), "Vulkan",
                    str(rec["n_gpu_layers"])] + extra + [r.test.name, f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}"]
            if self.traffic:
                vals += _traffic_cells(r)
            if self.spec:
                vals += [f"{100 * r.acceptance:.0f}% of {r.drafted}" if r.acceptance is not None else "-"]
            click.echo("| " + " | ".join(vals) + " |")
        self.header_done = True

    def done(self, footer: str | None = None) -> None:
        """The json list, or md's build line and `footer` (the box's rates) under the table."""
        if self.fmt == "json":
            click.echo(json.dumps(self.records, indent=2))
        elif self.fmt == "md":
            tune = self.records[-1]["vkrt_tune"] if self.records else ""
            click.echo(f"\nbuild: vkrt {__version__}" + (f", tuning overrides VKRT_TUNE={tune!r}" if tune else ""))
            if footer:
                click.echo(footer)


def _traffic_fields(r) -> dict:
    """A record's expert-traffic figures over the timed runs of a tg test (None: not counted)."""
    shares = r.expert_shares if not r.test.n_prompt else None
    per_token = r.bus_bytes_per_token if not r.test.n_prompt else None
    return {"experts_cached_share": shares and shares[0], "experts_copied_share": shares and shares[1],
            "experts_cpu_share": shares and shares[2], "bus_bytes_per_token": per_token}


def _traffic_cells(r) -> list[str]:
    """The md table's expert-traffic cells of a row: percent cached/copied/CPU and MB/tok."""
    f = _traffic_fields(r)
    if f["experts_cached_share"] is None:
        return ["-", "-"]
    shares = "/".join(f"{100 * f[k]:.0f}" for k in ("experts_cached_share", "experts_copied_share",
                                                    "experts_cpu_share"))
    return [shares, f"{f['bus_bytes_per_token'] / 1e6:.2f}" if f["bus_bytes_per_token"] is not None else "-"]
