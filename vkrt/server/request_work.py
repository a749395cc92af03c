"""Where a request's own work runs: parsing, checking, tokenising and building answers go to a
few threads of lower CPU priority (nice +10) than the scheduler thread and the driver's threads
(in_thread), and texts or token lists of megabytes to a sandbox worker process
(RequestTokenizer): the `tokenizers` library holds the GIL while it frees a large encoding (about
45 ms a MB of text), which would stall the scheduler thread and every stream with it."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .validation import BadRequest

THREADS = 4                  # requests' work at once (also bounds the memory their parsing takes)
SANDBOX_CHARS = 256 << 10    # a text longer than this is tokenised in a sandbox worker
SANDBOX_IDS = 64 << 10       # so are more token ids than this detokenised
TOKENIZE_SECONDS = 120.0     # the 8 MiB a body may hold take about 8 s on a desktop core
# a text no slot bounds (/tokenize's, /infill's) longer than this is refused, not tokenised: a
# tokenizer holds 250-750 bytes a token while it works (a worker has 1 GiB); prompts are bounded by
# their slot instead (routes.py _fits)
MAX_TOKENIZE_CHARS = 2 << 20


def _lower_priority() -> None:
    try:   # Linux: a thread has a nice value of its own
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (OSError, AttributeError):
        pass


_threads = ThreadPoolExecutor(THREADS, thread_name_prefix="vkrt-request", initializer=_lower_priority)


async def in_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) in a request thread."""
    return await asyncio.get_running_loop().run_in_executor(_threads, functools.partial(fn, *args, **kwargs))


class RequestTokenizer:
    """The model's tokenizer as request threads use it: encode/decode of large inputs in a sandbox
    worker (through `loop`, the event loop's), small ones here; everything else is the tokenizer's."""

    def __init__(self, tokenizer, sandbox, loop: asyncio.AbstractEventLoop):
        self.tokenizer, self.sandbox, self.loop = tokenizer, sandbox, loop
        self._json: str | None = None
        self._key: str | None = None

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def _setup(self) -> tuple[str, callable]:
        if self._json is None:
            self._json = self.tokenizer.hf.to_str()
            self._key = hashlib.sha256(self._json.encode()).hexdigest()[:16]
        return self._key, lambda: self._json

    def _in_sandbox(self, task: str, args: dict, attached: bytes, what: str) -> tuple[object, bytes]:
        key, payload = self._setup()
        call = self.sandbox.call(task, {"key": key, **args}, what=what, field=None, seconds=TOKENIZE_SECONDS,
                                 setup=(key, payload), attached=attached)
        return asyncio.run_coroutine_threadsafe(call, self.loop).result()

    def encode(self, text: str, add_special: bool = True, field: str | None = None) -> list[int]:
        """`field` names a text no slot bounds: one over MAX_TOKENIZE_CHARS is refused untokenised."""
        if field is not None and len(text) > MAX_TOKENIZE_CHARS:
            raise BadRequest(f"'{field}' is {len(text)} characters; vkrt tokenises at most {MAX_TOKENIZE_CHARS} "
                             f"characters of a text no slot bounds", field)
        if len(text) <= SANDBOX_CHARS or not hasattr(self.tokenizer, "hf"):
            return self.tokenizer.encode(text, add_special)
        _, ids = self._in_sandbox("tokenize", {}, text.encode("utf-8"), "tokenising the text")
        return self.tokenizer.with_bos(np.frombuffer(ids, np.int32).tolist(), add_special)

    def decode(self, ids, skip_special: bool = False) -> str:
        if len(ids) <= SANDBOX_IDS or not hasattr(self.tokenizer, "hf"):
            return self.tokenizer.decode(ids, skip_special)
        text, _ = self._in_sandbox("detokenize", {"skip_special": skip_special}, np.asarray(ids, np.int32).tobytes(),
                                   "detokenising the ids")
        return text
