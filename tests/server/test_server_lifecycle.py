"""Start, load, shutdown: /health is 503 until the model is ready; SIGTERM lets an in-flight
stream finish (or, with no grace time, cancels it) and the process exits cleanly; a model that
cannot load ends the server with one clear line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import socket
import threading
import time

from aiohttp.test_utils import TestClient, TestServer
from models import TINY

from vkrt.model.synthetic import write_model
from vkrt.server.app import make_app
from vkrt.server.chat_template import CHATML
from vkrt.server.metrics import Metrics
from vkrt.server.scheduler import STUCK_SECONDS, Scheduler
from vkrt.server.state import ServerConfig, ServerState

from .serverproc import ServerProcess


def test_health_is_503_while_loading():
    async def main():
        state = ServerState(ServerConfig(api_key="k"))
        async with TestClient(TestServer(make_app(state))) as client:
            health = await client.get("/health")
            models = await client.get("/v1/models", headers={"Authorization": "Bearer k"})
            unauthorized = await client.get("/v1/models")
            state.status = "ready"
            ready = await client.get("/health")
            return (health.status, await health.json(), models.status, unauthorized.status, ready.status)

    health, body, models, unauthorized, ready = asyncio.run(main())
    assert health == 503 and body["error"]["message"] == "Loading model"
    assert models == 503 and unauthorized == 401 and ready == 200


def _stream_in_thread(srv: ServerProcess, n: int) -> tuple[threading.Thread, dict, threading.Event]:
    """POST a streamed completion; `out` gets the data lines; `started` is set at the first one."""
    out, started = {"lines": []}, threading.Event()

    def run():
        import urllib.request
        req = urllib.request.Request(srv.url + "/v1/completions", method="POST",
                                     headers={**srv.headers(), "Content-Type": "application/json"},
                                     data=json.dumps({"prompt": "Hello", "max_tokens": n, "stream": True,
                                                      "stream_options": {"include_usage": True},
                                                      "ignore_eos": True, "temperature": 0}).encode())
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                for line in resp:
                    if line.startswith(b"data: "):
                        out["lines"].append(line.decode().strip())
                        started.set()
        except OSError as exc:
            out["error"] = exc
        started.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out, started


def test_sigterm_finishes_in_flight_stream(tiny_gguf):
    # the flags of the recommended command (less --n-cpu-moe: the tiny model is dense)
    srv = ServerProcess(tiny_gguf, "--no-mmap", "-ngl", "99", "-b", "2048", "-ub", "2048", "-fa", "1", "-c", "512",
                        "--shutdown-timeout", "60", api_key=None).wait_ready()
    t, out, started = _stream_in_thread(srv, 200)
    assert started.wait(60)
    assert srv.stop(signal.SIGTERM) == 0, srv.log
    t.join(30)
    lines = out["lines"]
    assert "error" not in out and lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == 200
    assert json.loads(lines[-3][6:])["choices"][0]["finish_reason"] == "length"
    assert "SIGTERM: finishing in-flight requests" in srv.log and "stopped" in srv.log
    for line in ("device: ", "placement: ", "pinning: ", "memory: ", "(no mmap)"):
        assert line in srv.log
    assert "Traceback" not in srv.log


def test_sigterm_without_grace_cancels(tiny_gguf):
    srv = ServerProcess(tiny_gguf, "-c", "512", "--shutdown-timeout", "0", api_key=None).wait_ready()
    t, out, started = _stream_in_thread(srv, 500)
    assert started.wait(60)
    assert srv.stop(signal.SIGTERM) == 0, srv.log
    t.join(30)
    last = json.loads(out["lines"][-1][6:])
    assert last["error"]["code"] == 503 and "shutting down" in last["error"]["message"]
    assert "cancelling the requests still running" in srv.log and "Traceback" not in srv.log


def test_unloadable_model_exits_with_one_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    srv = ServerProcess(str(bad), api_key=None)
    rc = srv.proc.wait(120)
    assert rc == 1, srv.log
    assert "ERROR vkrt.server" in srv.log and "broken.gguf" in srv.log and "Traceback" not in srv.log


def _closed_within(sock, seconds: float) -> bool:
    """Whether the server closes `sock` (recv gives b'') within `seconds`."""
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_timeout_closes_silent_and_trickling_clients(tiny_gguf):
    """-to: a connection that sends nothing, or only part of its headers, is closed after the
    timeout; a body that stops arriving gets a 408 naming the option; answered requests are not
    affected."""
    srv = ServerProcess(tiny_gguf, "-c", "512", "--timeout", "1.5", api_key=None).wait_ready()
    try:
        host, port = srv.url.removeprefix("http://").rsplit(":", 1)
        silent = socket.create_connection((host, int(port)))
        partial = socket.create_connection((host, int(port)))
        partial.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        body = socket.create_connection((host, int(port)))
        body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        for sock in (silent, partial):
            assert _closed_within(sock, 10), "the server kept a connection that sent no complete request"
            sock.close()
        body.settimeout(10)
        answer = body.recv(65536).decode()
        body.close()
        assert answer.startswith("HTTP/1.1 408"), answer
        assert "--timeout" in answer
        assert srv.get("/health")[0] == 200
    finally:
        assert srv.stop() == 0, srv.log
    assert "Traceback" not in srv.log, srv.log


def test_health_reports_a_stuck_step():
    """An iteration holding work past the limit makes /health a 503 naming the stall."""
    s = Scheduler(lambda: None, 1, Metrics())
    assert s.stuck() is None
    s._queue.append(object())
    assert s.stuck() is None
    s._beat -= STUCK_SECONDS + 1
    assert "stuck" in s.stuck()
    s._queue.clear()
    assert s.stuck() is None


TRAP = ("{% if 'LOOP' in messages[-1]['content'] %}{% for i in range(100000) %}{% for j in range(100000) %}"
        "{% endfor %}{% endfor %}{% endif %}" + CHATML)


def test_a_template_that_loops_is_a_400_and_holds_nothing(tmp_path):
    """The model's template loops for ever on one request: that request is a 400 once the sandbox's
    time limit passes; meanwhile /tokenize, /health and other chats answer; a stop with such a
    render in flight ends within --shutdown-timeout and the sandbox's grace, and says so."""
    path = str(tmp_path / "trap.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen3"], chat_template=TRAP))
    srv = ServerProcess(path, "-c", "256", "-np", "2", "--shutdown-timeout", "2", api_key=None).wait_ready()
    answers = {}

    def trapped(key):
        answers[key] = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "LOOP"}],
                                                          "max_tokens": 1})

    t = threading.Thread(target=trapped, args=("first",))
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    assert srv.post("/tokenize", {"content": "hello"})[0] == 200
    assert srv.get("/health")[0] == 200
    ok = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert ok[0] == 200 and time.monotonic() - t0 < 5
    t.join(60)
    status, body = answers["first"]
    assert status == 400 and "chat template took longer than" in body["error"]["message"], body
    threading.Thread(target=trapped, args=("second",), daemon=True).start()
    time.sleep(0.5)
    t0 = time.monotonic()
    assert srv.stop(signal.SIGTERM, timeout=30) == 0, srv.log
    assert time.monotonic() - t0 < 10 and srv.log.rstrip().endswith("stopped"), srv.log
