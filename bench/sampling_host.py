"""Host time per generated token: sampling from the whole row of logits on the host vs from the
best CANDIDATES logits picked on the GPU, and greedy with the host's argmax vs on the GPU.

    python bench/sampling_host.py [MODEL.gguf] [-n 16] [--json]

Without a model it writes a random-weight one with Gemma 3 270M's shapes and 262144-token
vocabulary (bench/peer.py's `gemma3`). Host time is the generation's wall time less the time the
engine waited for the GPU, per token: reading logits back, sampling, recording inputs, submitting.
The peer is the host-sampling path in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
from common import opened
from peer import SHAPES

from vkrt.device import Device
from vkrt.engine.sampler import Sampler, SamplingParams
from vkrt.model.synthetic import write_model

PROMPT = [2, 818, 5279, 529, 7001, 563]
SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)


def host_ms_per_token(engine, mode: str, n: int) -> float:
    """Generate n tokens after the prompt in `mode` (row / top / argmax / greedy); wall time less
    the engine's waits for the GPU, per token."""
    sampler = Sampler(SAMPLED)
    for warm in (True, False):   # the first round records the shapes
        engine.reset()
        logits = engine.eval(PROMPT)
        token = int(np.argmax(logits))
        t0, wait0 = time.perf_counter(), engine.stats.gpu_wait_seconds
        if mode == "greedy":
            for token in engine.greedy(token, 0, n):
                pass
        else:
            for _ in range(n):
                if mode == "top":
                    token = sampler.sample_top(*engine.candidates(token))
                else:
                    logits = engine.eval([token])
                    token = sampler.sample(logits) if mode == "row" else int(np.argmax(logits))
        wall, wait = time.perf_counter() - t0, engine.stats.gpu_wait_seconds - wait0
    return 1e3 * (wall - wait) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = args.model
    if path is None:
        path = os.path.join(tempfile.mkdtemp(), "gemma3-shaped.gguf")
        write_model(path, SHAPES["gemma3"])
    rows = {}
    with Device() as dev, opened(dev, path, n_ctx=512, n_ubatch=64) as (m, e):
        for name, whole, picked in (("sampled top-k 40", "row", "top"), ("greedy", "argmax", "greedy")):
            host = host_ms_per_token(e, whole, args.n)
            gpu = host_ms_per_token(e, picked, args.n)
            rows[name] = {"host_ms_whole_row": host, "host_ms_gpu_picked": gpu, "speedup_vs_whole_row": host / gpu}
        info = {**dev.identity(), "vocab": m.cfg.vocab_size, "tokens": args.n, "rows": rows}
    if args.json:
        print(json.dumps(info))
        return
    print(f"host ms per generated token on {info['device']}, vocabulary {info['vocab']}")
    print("| sampling | whole row on the host | picked on the GPU | speedup |")
    print("|---|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['host_ms_whole_row']:.2f} | {r['host_ms_gpu_picked']:.2f} | "
              f"{r['speedup_vs_whole_row']:.1f}x |")


if __name__ == "__main__":
    main()
