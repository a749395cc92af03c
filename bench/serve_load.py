"""Load test of an OpenAI-compatible server (vkrt serve, llama.cpp's llama-server, ...) from a
separate process: 1, 4 and 16 concurrent streaming clients by default.

    python bench/serve_load.py [--url http://127.0.0.1:8080] [--clients 1,4,16]
                               [--requests-per-client 4] [--duration 120] [--max-tokens 64]
                               [--api chat|completions] [--api-key KEY] [--model NAME]
                               [--server-cmd "vkrt serve -m M.gguf -np 16 --port {port}"] [--label NAME] [--json]
                               [--long-prompt-words 2000] [--disconnect-every 4]

Each level runs `clients` workers that send streaming requests back to back until
requests-per-client x clients requests were sent or --duration seconds passed (bounded in count
and time). Every request has its own prompt (a request number first, so no two share a cached
prefix beyond the chat template) and asks for --max-tokens tokens with ignore_eos, so every
server generates the same amount. Reported per level: requests/s, generated tokens/s over the
level's wall time, time to first token (first content chunk) p50/p99, per-request decode t/s,
and errors (any non-200 answer, error event, missing [DONE] or timeout).

Inter-token latency (the gaps between a stream's token chunks) p50/p99 is reported per level.
--long-prompt-words N: while a level runs, one more client sends prompts of about N words back to back
(their requests are reported apart); the level's inter-token latency then shows what a long prompt
arriving does to the other streams (compare with the same level without it).
--disconnect-every K: every K-th request closes its connection after its third token chunk; those
count as disconnects, not errors, and after the level the server must still answer a request.

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
from dataclasses import dataclass, field

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
    gaps: list = field(default_factory=list)   # seconds between consecutive token chunks
    disconnected: bool = False                 # closed on purpose (--disconnect-every)


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


async def one_request(session: aiohttp.ClientSession, args, i: int, prompt: str | None = None,
                      abort_after: int | None = None) -> Sample:
    prompt = f"[{i}] {prompt or args.prompt}"
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
    first, last, chunks, usage, done, gaps = None, None, 0, None, False, []
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
                    now = time.perf_counter()
                    chunks += 1
                    first = first or now
                    if last is not None:
                        gaps.append(now - last)
                    last = now
            if abort_after is not None and chunks >= abort_after:
                resp.close()   # the client goes away mid-stream
                return Sample(True, (first or t0) - t0, time.perf_counter() - t0, 0, gaps=gaps, disconnected=True)
    end = time.perf_counter()
    if not done:
        return Sample(False, error="the stream ended without data: [DONE]")
    tokens = usage["completion_tokens"] if usage else chunks
    return Sample(True, (first or end) - t0, end - t0, tokens, gaps=gaps)


async def run_level(args, clients: int, first_id: int) -> dict:
    n_requests = args.requests_per_client * clients
    samples: list[Sample] = []
    ids = iter(range(first_id, first_id + n_requests))
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    t0 = time.perf_counter()
    deadline = t0 + args.duration

    long_samples: list[Sample] = []
    running = True

    async def request(session, i, out, **kw):
        try:
            out.append(await one_request(session, args, i, **kw))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            out.append(Sample(False, error=f"{type(exc).__name__}: {exc}"))

    async def worker(session):
        for i in ids:
            if time.perf_counter() > deadline:
                return
            k = args.disconnect_every
            await request(session, i, samples, abort_after=3 if k and i % k == k - 1 else None)

    async def long_prompts(session):
        text = " ".join(f"word{j % 997}" for j in range(args.long_prompt_words))
        j = 0
        while running and time.perf_counter() < deadline:
            await request(session, 10 ** 7 + first_id + j, long_samples, prompt=text)
            if not long_samples[-1].ok:   # e.g. longer than a slot: say so once, do not hammer
                return
            j += 1

    # a new connection per request: servers differ in how long they keep idle ones open, and a
    # request written to a connection the server just closed would count as an error
    conn = aiohttp.TCPConnector(limit=clients + 1, force_close=True)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=conn) as session:
        extra = asyncio.ensure_future(long_prompts(session)) if args.long_prompt_words else None
        await asyncio.gather(*(worker(session) for _ in range(clients)))
        running = False
        if extra is not None:
            await extra
        after = []
        if args.disconnect_every:   # the server must still answer once the clients went away
            await request(session, 10 ** 8 + first_id, after)
    wall = time.perf_counter() - t0
    samples += [s for s in after if not s.ok]
    disconnects = sum(s.disconnected for s in samples)
    gaps = [g for s in samples if s.ok for g in s.gaps]
    samples = [s for s in samples if not s.disconnected]
    ok = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    decode = [(s.tokens - 1) / (s.seconds - s.ttft) for s in ok if s.tokens > 1 and s.seconds > s.ttft]
    errors = [s.error for s in samples if not s.ok]
    return {"clients": clients, "requests": len(samples), "ok": len(ok), "errors": len(errors),
            "first_errors": errors[:3], "wall_s": wall, "requests_per_s": len(ok) / wall,
            "tokens": tokens, "tokens_per_s": tokens / wall,
            "ttft_p50_ms": percentile([s.ttft for s in ok], 50) * 1e3,
            "ttft_p99_ms": percentile([s.ttft for s in ok], 99) * 1e3,
            "decode_tps_median": statistics.median(decode) if decode else 0.0,
            "itl_p50_ms": percentile(gaps, 50) * 1e3, "itl_p99_ms": percentile(gaps, 99) * 1e3,
            "disconnects": disconnects, "long_prompts": sum(s.ok for s in long_samples),
            "long_prompt_errors": sum(not s.ok for s in long_samples),
            "long_prompt_ttft_p50_ms": percentile([s.ttft for s in long_samples if s.ok], 50) * 1e3,
            "long_prompt_first_error": next((s.error for s in long_samples if not s.ok), "")}


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
        warm = argparse.Namespace(**{**vars(args), "requests_per_client": args.warmup, "duration": 1e9,
                                     "long_prompt_words": 0, "disconnect_every": 0})
        await run_level(warm, 1, 10 ** 6)
    levels, next_id = [], 0
    for c in args.clients:
        levels.append(await run_level(args, c, next_id))
        next_id += args.requests_per_client * c
    return {"url": args.url, "label": args.label, "api": args.api, "max_tokens": args.max_tokens, "levels": levels}


def table(result: dict) -> str:
    rows = [f"server: {result['label'] or result['url']} ({result['api']}, {result['max_tokens']} tokens a request)",
            "| clients | requests | errors | req/s | tokens/s | TTFT p50 ms | TTFT p99 ms | decode t/s per request "
            "| ITL p50 ms | ITL p99 ms |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for lv in result["levels"]:
        rows.append(f"| {lv['clients']} | {lv['ok']}/{lv['requests']} | {lv['errors']} | {lv['requests_per_s']:.2f} | "
                    f"{lv['tokens_per_s']:.1f} | {lv['ttft_p50_ms']:.0f} | {lv['ttft_p99_ms']:.0f} | "
                    f"{lv['decode_tps_median']:.1f} | {lv['itl_p50_ms']:.1f} | {lv['itl_p99_ms']:.1f} |")
        if lv["long_prompts"] or lv["long_prompt_errors"]:
            rows.append(f"  long prompts alongside: {lv['long_prompts']} served, {lv['long_prompt_errors']} errors, "
                        f"TTFT p50 {lv['long_prompt_ttft_p50_ms']:.0f} ms")
            if lv["long_prompt_first_error"]:
                rows.append(f"  long prompt error: {lv['long_prompt_first_error']}")
        if lv["disconnects"]:
            rows.append(f"  disconnected on purpose: {lv['disconnects']} requests")
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
    ap.add_argument("--long-prompt-words", type=int, default=0,
                    help="One more client sends prompts of about this many words during each level.")
    ap.add_argument("--disconnect-every", type=int, default=0,
                    help="Every K-th request disconnects after its third token chunk.")
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
    if any(lv["errors"] or lv["long_prompt_errors"] for lv in result["levels"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
