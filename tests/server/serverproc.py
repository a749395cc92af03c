"""A `vkrt serve` subprocess on a free loopback port, and helpers to query it."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from vkrt.server.metrics import parse

API_KEY = "test-key"
_LISTENING = re.compile(r"listening on (http://[\d.]+:\d+)")


class ServerProcess:
    """`python -m vkrt.cli serve ...` with its log collected; url is known once it listens."""

    def __init__(self, model: str, *args: str, api_key: str | None = API_KEY):
        cmd = [sys.executable, "-m", "vkrt.cli", "serve", "-m", model, "--port", "0", *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.api_key = api_key
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.url: str | None = None
        self._listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            m = _LISTENING.search(line)
            if m:
                self.url = m.group(1)
                self._listening.set()
        self._listening.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, timeout: float = 180.0) -> "ServerProcess":
        if not self._listening.wait(timeout) or self.url is None:
            raise AssertionError(f"the server did not start:\n{self.log}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log}")
            if self.get("/health")[0] == 200:
                return self
            time.sleep(0.1)
        raise AssertionError(f"the server never became ready:\n{self.log}")

    def headers(self, key: str | None = None) -> dict:
        key = self.api_key if key is None else key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 60.0) -> tuple[int, bytes]:
        h = {"Content-Type": "application/json", **self.headers(), **(headers or {})}
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def raw(self, head: str, body: bytes = b"", timeout: float = 5.0) -> tuple[int, bytes, float]:
        """Send `head` (request line and headers, without Host, the API key or the blank line)
        and `body` as they are on a new connection left open, for what urllib will not send (no
        Content-Type, a false Content-Length, chunks); the answer's status and body, and the
        seconds it took to come."""
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        head += f"\r\nHost: {host}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in self.headers().items()) + "\r\n"
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            start = time.monotonic()
            sock.sendall(head.encode() + body)
            return (*_read_answer(sock), time.monotonic() - start)

    def get(self, path: str, **kw) -> tuple[int, bytes]:
        return self.request("GET", path, **kw)

    def post(self, path: str, obj, **kw) -> tuple[int, dict]:
        status, raw = self.request("POST", path, json.dumps(obj).encode(), **kw)
        return status, json.loads(raw)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not exit within {timeout} s of {sig!r}:\n{self.log}")


def _read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of one HTTP/1.1 answer with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _recv(sock, data)
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        body += _recv(sock, head + body)
    return int(lines[0].split()[1]), body[:length]


def _recv(sock: socket.socket, so_far: bytes) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise AssertionError(f"the server closed the connection before its whole answer: {so_far!r}")
    return chunk


def serving(model: str, *args: str):
    """A started server for a fixture to yield; on exit it must stop cleanly with a clean log."""
    srv = ServerProcess(model, *args)
    try:
        yield srv.wait_ready()
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log
    assert "Traceback" not in srv.log and "ERROR vkrt.vulkan" not in srv.log, srv.log


def metric(server: ServerProcess, name: str) -> float:
    status, raw = server.get("/metrics")
    assert status == 200
    return parse(raw.decode())[name]


def wait_idle(server: ServerProcess, timeout: float = 30.0) -> list[dict]:
    """Poll /slots until no slot is busy; returns the slots."""
    deadline = time.monotonic() + timeout
    while True:
        status, raw = server.get("/slots")
        slots = json.loads(raw)
        if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
            return slots
        time.sleep(0.05)
