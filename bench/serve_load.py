"""Load test of an OpenAI-compatible server (vkrt serve, llama.cpp's llama-server, ...) from a
separate process: 1, 4 and 16 concurrent streaming clients by default.

    python bench/serve_load.py [--url http://127.0.0.1:8080] [--clients 1,4,16]
                               [--requests-per-client 4] [--duration 120] [--max-tokens 64]
                               [--api chat|completions] [--api-key KEY] [--model NAME]
                               [--server-cmd "vkrt serve -m M.gguf -np 16 --port {port}"] [--label NAME] [--json]

Each level runs `clients` workers that send streaming requests back to back until
requests-per-client x clients requests were sent or --duration seconds passed (bounded in count
and time). Every request has its own prompt (a request number first, so no two share a cached
prefix beyond the chat template) and asks for --max-tokens tokens with ignore_eos, so every
server generates the same amount. Reported per level: requests/s, generated tokens/s over the
level's wall time, time to first token (first content chunk) p50/p99, per-request decode t/s,
and errors (any non-200 answer, error event, missing [DONE] or timeout).

--server-cmd starts the server itself ({port} is replaced by a free port), waits for /health and
stops it with SIGTERM afterwards. Only loopback addresses are accepted as targets.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

import aiohttp

PROMPT = ("Write a short story about a fox who learns to count. The fox lives near a quiet river, "
          "and every morning it watches the birds and the fish. Tell it in simple words.")


@dataclass
class Sample:
    ok: bool
    ttft: float = 0.0       # seconds from sending to the first content chunk
    seconds: float = 0.0    # whole request
    tokens: int = 0
    error: str = ""


def loopback_only(url: str) -> None:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    sys.exit(f"serve_load: {url} is not a loopback address (127.0.0.0/8, ::1, localhost); refusing to load it")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(q / 100 * len(s)))) - 1]


def token_chunk(choice: dict, api: str) -> bool:
    """Whether a stream chunk's choice carries a generated token's text. The text may be empty (a
    token that renders as nothing, e.g. a random model's control tokens in llama-server): the
    chunk still marks a token. Not the chat stream's opening role chunk, nor the finish chunk."""
    if choice.get("finish_reason") is not None:
        return False
    if api == "chat":
        delta = choice.get("delta") or {}
        return delta.get("content") is not None and ("role" not in delta or delta["content"] != "")
    return choice.get("text") is not None


async def one_request(session: aiohttp.ClientSession, args, i: int) -> Sample:
    prompt = f"[{i}] {args.prompt}"
    body = {"max_tokens": args.max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "temperature": args.temperature}
    if args.model:
        body["model"] = args.model
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.api == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    t0 = time.perf_counter()
    first, chunks, usage, done = None, 0, None, False
    async with session.post(args.url + path, json=body) as resp:
        if resp.status != 200:
            return Sample(False, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            obj = json.loads(data)
            if "error" in obj:
                return Sample(False, error=f"error event: {obj['error']}")
            usage = obj.get("usage") or usage
            for ch in obj.get("choices") or ():
                if token_chunk(ch, args.api):
                    chunks += 1
                    first = first or time.perf_counter()
    end = time.perf_counter()
    if not done:
        return Sample(False, error="the stream ended without data: [DONE]")
    tokens = usage["completion_tokens"] if usage else chunks
    return Sample(True, (first or end) - t0, end - t0, tokens)


async def run_level(args, clients: int, first_id: int) -> dict:
    n_requests = args.requests_per_client * clients
    samples: list[Sample] = []
    ids = iter(range(first_id, first_id + n_requests))
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    t0 = time.perf_counter()
    deadline = t0 + args.duration

    async def worker(session):
        for i in ids:
            if time.perf_counter() > deadline:
                return
            try:
                samples.append(await one_request(session, args, i))
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                samples.append(Sample(False, error=f"{type(exc).__name__}: {exc}"))

    # a new connection per request: servers differ in how long they keep idle ones open, and a
    # request written to a connection the server just closed would count as an error
    conn = aiohttp.TCPConnector(limit=clients, force_close=True)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=conn) as session:
        await asyncio.gather(*(worker(session) for _ in range(clients)))
    wall = time.perf_counter() - t0
    ok = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    decode = [(s.tokens - 1) / (s.seconds - s.ttft) for s in ok if s.tokens > 1 and s.seconds > s.ttft]
    errors = [s.error for s in samples if not s.ok]
    return {"clients": clients, "requests": len(samples), "ok": len(ok), "errors": len(errors),
            "first_errors": errors[:3], "wall_s": wall, "requests_per_s": len(ok) / wall,
            "tokens": tokens, "tokens_per_s": tokens / wall,
            "ttft_p50_ms": percentile([s.ttft for s in ok], 50) * 1e3,
            "ttft_p99_ms": percentile([s.ttft for s in ok], 99) * 1e3,
            "decode_tps_median": statistics.median(decode) if decode else 0.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd: str, startup_timeout: float) -> tuple[subprocess.Popen, str, str]:
    port = free_port()
    argv = shlex.split(cmd.replace("{port}", str(port)))
    log = tempfile.NamedTemporaryFile("w", prefix="serve_load-", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"serve_load: the server exited with {proc.returncode}; log: {log.name}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url, log.name
        except OSError:
            pass
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    sys.exit(f"serve_load: the server was not ready within {startup_timeout:.0f} s; log: {log.name}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def bench(args) -> dict:
    if args.warmup:  # the first request per shape may compile shaders (llama.cpp: 10-60 s)
        warm = argparse.Namespace(**{**vars(args), "requests_per_client": args.warmup, "duration": 1e9})
        await run_level(warm, 1, 10 ** 6)
    levels, next_id = [], 0
    for c in args.clients:
        levels.append(await run_level(args, c, next_id))
        next_id += args.requests_per_client * c
    return {"url": args.url, "label": args.label, "api": args.api, "max_tokens": args.max_tokens, "levels": levels}


def table(result: dict) -> str:
    rows = [f"server: {result['label'] or result['url']} ({result['api']}, {result['max_tokens']} tokens a request)",
            "| clients | requests | errors | req/s | tokens/s | TTFT p50 ms | TTFT p99 ms | decode t/s per request |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for lv in result["levels"]:
        rows.append(f"| {lv['clients']} | {lv['ok']}/{lv['requests']} | {lv['errors']} | {lv['requests_per_s']:.2f} | "
                    f"{lv['tokens_per_s']:.1f} | {lv['ttft_p50_ms']:.0f} | {lv['ttft_p99_ms']:.0f} | "
                    f"{lv['decode_tps_median']:.1f} |")
        for e in lv["first_errors"]:
            rows.append(f"  error: {e}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", default="1,4,16", help="Concurrency levels, comma-separated.")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--duration", type=float, default=120.0, help="Seconds a level may start requests for.")
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--api", choices=["chat", "completions"], default="chat")
    ap.add_argument("--model", default=None, help="The `model` field to send (default: none).")
    ap.add_argument("--api-key", default=os.environ.get("VKRT_API_KEY"))
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                    help="Do not send ignore_eos (for servers that reject unknown fields).")
    ap.add_argument("--warmup", type=int, default=1, help="Requests sent (and not counted) before the levels.")
    ap.add_argument("--server-cmd", default=None, help="Start this server first; {port} is replaced.")
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    proc = None
    if args.server_cmd:
        proc, args.url, log = start_server(args.server_cmd, args.startup_timeout)
        print(f"serve_load: started `{args.server_cmd}` at {args.url}; log: {log}", file=sys.stderr)
    else:
        loopback_only(args.url)
    args.url = args.url.rstrip("/")
    try:
        result = asyncio.run(bench(args))
    finally:
        if proc is not None:
            stop_server(proc)
    print(json.dumps(result, indent=1) if args.json else table(result))
    if any(lv["errors"] for lv in result["levels"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
