"""What a recurrent model's partly rejected speculative steps cost in tokens fed: the DeltaNet
catch-up (RecurrentState.catch_up: the state brought forward over the accepted tokens' kept
inputs) against replay (the accepted tokens fed again at the front of the next step).

    python bench/spec_catch_up.py [MODEL.gguf] [-n 96] [--draft-max 4] [--wrong 5] [--json]

Default model: a tiny generated qwen35moe (vkrt.model.synthetic). Greedy generation of -n tokens
after a repeating prompt, three ways: without speculation (the reference tokens), then with a
drafter that proposes the reference's next --draft-max tokens with every --wrong-th drafted token
changed (steps accept some drafts and reject the rest, in every pattern), once with catch-up (the
engine told its steps' size, --draft-max + 1: verify_tokens) and once with replay (no step keeps
its inputs). Rows: tokens generated, drafted and accepted, steps,
tokens fed after the prompt and a generated token's share, the generation's t/s (llama-server's
predicted t/s, of a second run: the first records the graphs and catch-ups it meets), whether the
tokens equal the reference's (they must). Then the catch-ups' host time: the first (which
records the slot's catch-up) and the median of the rest (the recorded one run again).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from common import delta_net_model, lacks_delta_net, print_json
import vkrt.engine.stage as stage_module
from vkrt.device import Device
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.recurrent_state import keep_columns
from vkrt.engine.sampler import GREEDY
from vkrt.engine.speculative import SpecOptions, Speculation
from vkrt.model.loader import Model

PROMPT = list(range(5, 40)) * 3 + list(range(5, 12))


class WrongEvery:
    """Drafts the reference's continuation, every `wrong`-th drafted token (counted over the run)
    changed to another."""

    def __init__(self, prompt_len: int, reference: list[int], wrong: int):
        self.prompt_len, self.reference, self.wrong, self.made = prompt_len, reference, wrong, 0

    def draft(self, history, n):
        done = len(history) - self.prompt_len
        out = list(self.reference[done:done + n])
        for j in range(len(out)):
            self.made += 1
            if self.made % self.wrong == 0:
                out[j] = (out[j] + 1) % 100 + 3
        return out


def _time_catch_ups(engine) -> list[float]:
    """Host milliseconds of each truncate() that caught a state up (the first records the
    slot's catch-up, the rest replay it), appended as the engine runs."""
    times, truncate = [], engine.truncate

    def timed(seq_id, length):
        st = engine.state
        caught = st.length[seq_id] > length and st.catch_up_span(seq_id, length) is not None
        t0 = time.perf_counter()
        out = truncate(seq_id, length)
        if caught:
            times.append(1000.0 * (time.perf_counter() - t0))
        return out
    engine.truncate = timed
    return times


def run(model, n: int, draft_max: int, wrong: int, keep: bool, reference: list[int]) -> dict:
    if not keep:   # the stages keep no columns: every step replays
        stage_module.keep_columns = lambda n_ubatch, verify_tokens=0: 0
    opts = SpecOptions("ngram", draft_max=draft_max)
    try:
        with Engine(model, n_ctx=512, n_ubatch=64, verify_tokens=opts.step_tokens()) as e:
            catch_ups = _time_catch_ups(e)
            for timed in (False, True):   # the first run records the graphs and catch-ups it meets
                e.reset()
                spec = Speculation(opts, WrongEvery(len(PROMPT), reference, wrong))
                t0, s0 = e.stats.tokens, e.stats.steps
                gen = generate(e, PROMPT, n, GREEDY, speculation=spec)
            fed = e.stats.tokens - t0 - len(PROMPT)
            ms = gen.timings.predicted_ms
            return {"way": "catch-up" if keep else "replay", "generated": len(gen.tokens),
                    "drafted": gen.timings.draft_n, "accepted": gen.timings.draft_n_accepted,
                    "steps": e.stats.steps - s0, "tokens_fed": fed, "fed_per_token": fed / max(1, len(gen.tokens)),
                    "same_tokens": gen.tokens == reference, "generation_ms": ms,
                    "tokens_per_second": 1000.0 * len(gen.tokens) / ms if ms else None,
                    "catch_ups": len(catch_ups),
                    "first_catch_up_host_ms": catch_ups[0] if catch_ups else None,
                    "catch_up_host_ms_median": statistics.median(catch_ups[1:]) if len(catch_ups) > 1 else None}
    finally:
        stage_module.keep_columns = keep_columns


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--wrong", type=int, default=5, help="every this many drafted tokens one is wrong")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, Device() as dev:
        path = args.model or delta_net_model(tmp, 4)   # 3 DeltaNet layers, then gated attention
        with Model(dev, path, progress=False) as m:
            if lacks_delta_net(m.cfg, path):
                return 2
            with Engine(m, n_ctx=512, n_ubatch=64) as e:
                reference = generate(e, PROMPT, args.n, GREEDY).tokens
            rows = [run(m, args.n, args.draft_max, args.wrong, keep, reference) for keep in (True, False)]
        info = {"model": os.path.basename(path), "device": dev.identity()["device"], "draft_max": args.draft_max,
                "wrong_every": args.wrong, "results": rows,
                "tokens_fed_vs_replay": rows[0]["tokens_fed"] / max(1, rows[1]["tokens_fed"]),
                "steps_vs_replay": rows[0]["steps"] / max(1, rows[1]["steps"]),
                "speedup_vs_replay": (rows[0]["tokens_per_second"] / rows[1]["tokens_per_second"]
                                      if rows[0]["tokens_per_second"] and rows[1]["tokens_per_second"] else None)}
    if args.json:
        print_json(info)
        return 0
    print(f"# {info['model']} on {info['device']}, --draft-max {args.draft_max}, every {args.wrong}th draft wrong")
    print("| way | generated | drafted | accepted | steps | tokens fed | fed a token | t/s | same tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['way']} | {r['generated']} | {r['drafted']} | {r['accepted']} | {r['steps']} | {r['tokens_fed']} "
              f"| {r['fed_per_token']:.2f} | {r['tokens_per_second'] or 0:.1f} | {r['same_tokens']} |")
    print(f"catch-up against replay: tokens fed {info['tokens_fed_vs_replay']:.2f}x, steps {info['steps_vs_replay']:.2f}x, "
          f"t/s {info['speedup_vs_replay'] or 0:.2f}x")
    c = rows[0]
    if c["catch_ups"]:
        print(f"catch-ups: {c['catch_ups']}, host ms the first (records) {c['first_catch_up_host_ms']:.2f}, "
              f"the rest (median) {c['catch_up_host_ms_median'] or 0:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
