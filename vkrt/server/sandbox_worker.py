"""A sandbox worker process (`python -m vkrt.server.sandbox_worker MEMORY_BYTES`): renders chat
templates and compiles grammars for the server (sandbox.py), under an address-space limit of
MEMORY_BYTES beyond what it holds once started, and dies with the server. Requests arrive on
stdin and answers leave on stdout, each a frame: two 4-byte big-endian lengths, then that much JSON
and that many bytes of a binary attachment (a request body to parse, the numbers parsed from it)."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import sys

HEADER = struct.Struct(">II")
PR_SET_PDEATHSIG = 1


def read_frame(stream) -> tuple[dict, bytes] | None:
    """The next frame's object and attachment, or None at end of stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    size, attached = HEADER.unpack(head)
    return json.loads(stream.read(size)), stream.read(attached)


def frame(obj, attached: bytes = b"") -> bytes:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(data), len(attached)) + data + attached


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _limit_memory(extra: int) -> None:
    """Address space capped at what the worker holds now plus `extra` bytes: a template that
    allocates gigabytes gets MemoryError here, not the server's memory."""
    if extra > 0 and os.path.exists("/proc/self/status"):
        limit = _vm_size() + extra
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _die_with_parent() -> None:
    """Killed when the server dies, even mid-render (Linux; elsewhere EOF on stdin ends an idle worker)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main() -> None:
    _die_with_parent()
    os.nice(10)   # behind the scheduler and the driver's threads for the CPU
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr   # stdout is the channel: a stray print must not corrupt it
    from .sandbox_tasks import TASKS, run
    _limit_memory(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    while True:
        got = read_frame(inp)
        if got is None:
            return
        request, attached = got
        args = {**request["args"], "attached": attached} if attached else request["args"]
        out.write(frame(*run(TASKS[request["task"]], args)))
        out.flush()


if __name__ == "__main__":
    main()
