"""Server-Sent Events: a job's events written as `data: {json}` lines as they arrive."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from .jobs import Done, Failed, Job, Piece

log = logging.getLogger("vkrt.server")

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8", "replace") + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def stream(request: web.Request, job: Job, fmt,
                 include_usage: bool) -> tuple[web.StreamResponse, Done | None, bool]:
    """Write the job's events to the client. Returns (response, the Done event or None, whether the
    job ended on the server side); a client that went away leaves the job running for the caller
    to cancel."""
    resp = web.StreamResponse(headers=HEADERS)
    await resp.prepare(request)
    try:
        for chunk in fmt.start():
            await resp.write(event(chunk))
        while True:
            ev = await job.next_event()
            if isinstance(ev, Piece):
                chunk = fmt.piece(ev.text, ev.tokens, ev.probs)
                if chunk is not None:
                    await resp.write(event(chunk))
            elif isinstance(ev, Done):
                for chunk in fmt.end(ev, include_usage):
                    await resp.write(event(chunk))
                if fmt.done_line:
                    await resp.write(DONE)
                await resp.write_eof()
                return resp, ev, True
            elif isinstance(ev, Failed):
                kind = "server_error" if ev.status == 500 else "unavailable_error"
                await resp.write(event({"error": {"code": ev.status, "message": ev.message, "type": kind}}))
                await resp.write_eof()
                return resp, None, True
    except ConnectionError:  # the client closed the connection
        return resp, None, False
    except Exception as exc:  # a bug: the status line is out, so say it in the stream
        log.exception("streaming failed")
        try:
            await resp.write(event({"error": {"code": 500, "message": "internal error (the server log has the details)",
                                              "type": "server_error"}}))
        except ConnectionError:
            pass
        return resp, None, False
