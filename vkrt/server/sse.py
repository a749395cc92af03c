"""Server-Sent Events: a job's events written as `data: {json}` lines as they arrive (preceded by
an `event: {type}` line where the format names its events: Anthropic's and OpenAI Responses')."""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from .jobs import Done, Failed, Job, Piece

log = logging.getLogger("vkrt.server")

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(obj, named: bool = False) -> bytes:
    head = b"event: " + obj["type"].encode() + b"\n" if named else b""
    return head + b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8", "replace") + b"\n\n"


def error_event(fmt, status: int, message: str, type: str) -> dict:
    """The format's error event, else an OpenAI-style error object."""
    if hasattr(fmt, "error"):
        return fmt.error(status, message, type)
    return {"error": {"code": status, "message": message, "type": type}}


DONE = b"data: [DONE]\n\n"


async def events(jobs: list[Job]):
    """(choice index, event) of the jobs as they come; each job ends with Done or Failed."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, job: Job) -> None:
        while True:
            ev = await job.next_event()
            await queue.put((i, ev))
            if isinstance(ev, (Done, Failed)):
                return

    tasks = [asyncio.ensure_future(pump(i, j)) for i, j in enumerate(jobs)]
    try:
        left = len(jobs)
        while left:
            i, ev = await queue.get()
            left -= isinstance(ev, (Done, Failed))
            yield i, ev
    finally:
        for t in tasks:
            t.cancel()


async def stream(request: web.Request, jobs: list[Job], fmt,
                 include_usage: bool) -> tuple[web.StreamResponse, list[Done] | None, bool]:
    """Write the jobs' events (one choice each) to the client. Returns (response, the Done events
    or None, whether the jobs ended on the server side); a client that went away leaves them
    running for the caller to cancel."""
    resp = web.StreamResponse(headers=HEADERS)
    await resp.prepare(request)
    dones: list = [None] * len(jobs)
    named = getattr(fmt, "named_events", False)
    try:
        for chunk in fmt.start(len(jobs)):
            await resp.write(event(chunk, named))
        async for i, ev in events(jobs):
            if isinstance(ev, Piece):
                for chunk in fmt.piece(ev.text, ev.tokens, ev.probs, index=i):
                    if ev.timings is not None:   # timings_per_token
                        chunk["timings"] = ev.timings
                    await resp.write(event(chunk, named))
            elif isinstance(ev, Done):
                dones[i] = ev
                last = all(d is not None for d in dones)
                for chunk in fmt.end(ev, include_usage and last, index=i, dones=dones if last else None):
                    await resp.write(event(chunk, named))
                if last:
                    if fmt.done_line:
                        await resp.write(DONE)
                    await resp.write_eof()
                    return resp, dones, True
            elif isinstance(ev, Failed):
                await resp.write(event(error_event(fmt, ev.status, ev.message, ev.type), named))
                await resp.write_eof()
                return resp, None, True
    except ConnectionError:  # the client closed the connection
        return resp, None, False
    except Exception:  # a bug: the status line is out, so say it in the stream
        log.exception("streaming failed")
        try:
            await resp.write(event(error_event(fmt, 500, "internal error (the server log has the details)",
                                               "server_error"), named))
        except ConnectionError:
            pass
        return resp, None, False
