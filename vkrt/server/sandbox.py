"""Sandbox workers: processes that render chat templates and compile grammars for the server, so
that a template looping for ever, a grammar the compiler takes minutes over, gigabytes allocated
or a native crash costs one worker, not the server. A call past its time limit, or whose client
left, kills its worker (a fresh one takes its place); each worker runs under an address-space
limit (sandbox_worker.py). The event loop only moves bytes: frames are encoded and decoded in
threads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from typing import Callable

from .sandbox_worker import HEADER, frame
from .validation import ApiError, BadRequest

log = logging.getLogger("vkrt.server")

WORKERS = 4                   # at most this many render or compile at once; the others wait their turn
MEMORY_BYTES = 1 << 30        # each worker's address space beyond its own start-up
SECONDS = 10.0                # a render or compile past this is stopped (a 400)
FRAME_LIMIT = 1 << 30         # an answer this large is a broken worker
KEEP_RSS_BYTES = 384 << 20    # a worker holding more than this after a call is replaced


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.has: set[str] = set()   # the setup keys it was sent (a tokenizer)

    async def ask(self, data: bytes) -> tuple[dict, bytes]:
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()
        head = await self.proc.stdout.readexactly(HEADER.size)
        size, attached = HEADER.unpack(head)
        if size + attached > FRAME_LIMIT:
            raise ConnectionError(f"a frame of {size + attached} bytes")
        body = await self.proc.stdout.readexactly(size)
        extra = await self.proc.stdout.readexactly(attached) if attached else b""
        return (await asyncio.to_thread(json.loads, body) if size > 65536 else json.loads(body)), extra

    def rss(self) -> int:
        """Resident bytes (0 where /proc cannot say)."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            return 0

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


class Sandbox:
    """await sandbox.call(task, args, what=..., field=...) -> the task's result (sandbox_tasks.py)."""

    def __init__(self, workers: int = WORKERS, memory_bytes: int = MEMORY_BYTES, seconds: float = SECONDS):
        self.workers, self.memory_bytes, self.seconds = workers, memory_bytes, seconds
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._turns: asyncio.Semaphore | None = None
        self._closed = False
        self._reaping: set[asyncio.Task] = set()   # waits for killed workers to exit
        self.killed = 0   # workers stopped: past the time limit, client gone, or died

    async def start(self, n: int = 1) -> None:
        """Start `n` workers ahead of the first request (each takes a fraction of a second)."""
        for _ in range(n):
            self._idle.append(await self._spawn())

    async def _spawn(self) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vkrt.server.sandbox_worker", str(self.memory_bytes),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        worker = _Worker(proc)
        self._all.add(worker)
        return worker

    def _retire(self, worker: _Worker, killed: bool = True) -> None:
        worker.kill()
        self._all.discard(worker)
        self.killed += killed
        reap = asyncio.get_running_loop().create_task(worker.proc.wait())
        self._reaping.add(reap)
        reap.add_done_callback(self._reaping.discard)

    async def call(self, task: str, args: dict, *, what: str, field: str | None, seconds: float | None = None,
                   setup: tuple[str, Callable[[], object]] | None = None, attached: bytes | None = None):
        """The task's result; a refusal, the time limit (`seconds`, else the sandbox's), the
        worker's death: a 400 naming `field`. `what` names the work in those messages ("the chat
        template", "'json_schema'"), and begins those that are not the task's own refusals.
        setup: (key, payload()) the task needs once per worker, passed as its `setup` argument to a
        worker that has not had that key (a tokenizer's JSON). With `attached` (bytes the task
        takes as its `attached` argument), the result is (value, the bytes it answered with)."""
        if self._closed:
            raise ApiError("the server is shutting down", field, status=503, type="unavailable_error")
        if self._turns is None:
            self._turns = asyncio.Semaphore(self.workers)
        seconds = seconds or self.seconds
        async with self._turns:
            worker = self._idle.pop() if self._idle else await self._spawn()
            if setup is not None and setup[0] not in worker.has:
                args = {**args, "setup": setup[1]()}
            try:
                data = await asyncio.to_thread(frame, {"task": task, "args": args}, attached or b"")
                async with asyncio.timeout(seconds):
                    reply, answered = await worker.ask(data)
            except TimeoutError:
                self._retire(worker)
                raise BadRequest(f"{what} took longer than {seconds:g} s and was stopped", field) from None
            except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
                self._retire(worker)
                log.warning("a sandbox worker died on %s (exit status %s)", what, worker.proc.returncode)
                raise BadRequest(f"{what} crashed its worker or ran out of memory "
                                 f"({type(exc).__name__})", field) from None
            except BaseException:   # cancelled (the client left): the work is not wanted
                self._retire(worker)
                raise
            if setup is not None and "ok" in reply:
                worker.has.add(setup[0])
            if worker.rss() > KEEP_RSS_BYTES:   # what a big render left allocated goes with the worker
                self._retire(worker, killed=False)
            else:
                self._idle.append(worker)
        if "error" in reply:
            message = reply["error"]
            raise BadRequest(message if reply.get("refused") else f"{what} {message}", reply.get("param") or field)
        return reply["ok"] if attached is None else (reply["ok"], answered)

    @property
    def busy(self) -> int:
        """Workers working now."""
        return len(self._all) - len(self._idle)

    async def close(self) -> None:
        """Stop every worker (one mid-render too) and reap it."""
        self._closed = True
        workers = list(self._all)
        reaping, self._reaping = self._reaping, set()
        self._all.clear()
        self._idle.clear()
        for worker in workers:
            worker.kill()
        waits = [asyncio.ensure_future(worker.proc.wait()) for worker in workers] + list(reaping)
        if waits:
            await asyncio.wait(waits, timeout=5.0)
