"""The server's HTTP app in this process over a scripted model: no device, no weights. A reply
function maps the rendered prompt to the text the "model" writes, sent in small pieces as a
generating slot would, so tests control exactly what the reply parsers see."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Callable

from aiohttp import web

from vkrt.engine.generate import Timings
from vkrt.server.app import make_app
from vkrt.server.jobs import Done, Job, Piece
from vkrt.server.state import ServerConfig, ServerState

PIECE = 3   # characters a streamed piece


class ByteTokenizer:
    """A token a byte: prompts decode back to the rendered text."""

    bos_id = eos_id = None
    add_bos = False
    eog_ids = frozenset()

    def __init__(self):
        self.tokens = [chr(i) for i in range(256)]
        self.token_types = [1] * 256

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special: bool = False) -> str:
        return bytes(ids).decode("utf-8", "replace")


class ScriptedScheduler:
    """Answers each job at once with reply(prompt text), in pieces; remembers the prompts."""

    def __init__(self, tokenizer: ByteTokenizer, reply: Callable[[str], str]):
        self.tokenizer, self.reply = tokenizer, reply
        self.prompts: list[str] = []

    def submit(self, job: Job) -> None:
        prompt = self.tokenizer.decode(job.prompt)
        self.prompts.append(prompt)
        text = self.reply(prompt)
        for i in range(0, len(text), PIECE):
            job.emit(Piece(text[i:i + PIECE], [0]))
        n = max(1, len(text) // PIECE)
        job.emit(Done("stop", "eos", "", len(job.prompt), 0, n, Timings(len(job.prompt), 1.0, n, 1.0), 0))

    def cancel(self, job: Job) -> None:
        pass

    def counts(self) -> tuple[int, int]:
        return 0, 0

    def stuck(self) -> None:
        return None


class ScriptedServer:
    """The app on a loopback port in a thread of its own; `url` serves /v1."""

    def __init__(self, template: str, reply: Callable[[str], str], **config):
        self.reply = reply
        tok = ByteTokenizer()
        state = ServerState(ServerConfig(port=0, allowed_hosts=None, **config))
        cfg = SimpleNamespace(arch="llama", vocab_size=256, n_ctx_train=4096, n_embd=8)
        model = SimpleNamespace(tokenizer=tok, gguf=SimpleNamespace(metadata={"tokenizer.chat_template": template}),
                                cfg=cfg, path="scripted.gguf", n_params=0, size_bytes=0)
        state.ready(SimpleNamespace(model=model, engine=SimpleNamespace(n_ctx=4096)))
        state.constraints = lambda grammar, n: [None] * n   # the scripted model ignores grammars
        state.scheduler = self.scheduler = ScriptedScheduler(tok, lambda prompt: self.reply(prompt))
        self.state = state
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(make_app(self.state))
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        self._started.set()
        self._loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        asyncio.run_coroutine_threadsafe(self.state.sandbox.close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
