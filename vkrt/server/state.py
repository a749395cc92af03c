"""Server configuration and the state the handlers read: loading / ready / stopping, and once
ready the model, engine, tokenizer, chat template and limits."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..engine.grammar import Constraint, GrammarError, grammar_tokenizer
from ..engine.pooling import default_pooling
from ..engine.sampler import SamplingParams
from .chat_output import TemplateSyntax
from .chat_template import ChatTemplate
from .metrics import Metrics
from .request_work import RequestTokenizer
from .sandbox import Sandbox
from .schemas import Limits
from .tool_grammar import special_markers
from .validation import BadRequest

LOADING, READY, STOPPING, FAILED = "loading", "ready", "stopping", "failed"


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    n_parallel: int = 1
    api_key: str | None = None
    body_limit: int = 8 << 20
    model_name: str = "model"
    shutdown_timeout: float = 10.0   # seconds in-flight requests may take to finish on SIGINT/SIGTERM
    ctx_checkpoints: int = 4         # recurrent-state checkpoints a slot keeps (models with DeltaNet layers)
    allowed_hosts: tuple[str, ...] | None = None   # Host header names accepted (None: any)
    # seconds a connection may take to deliver a request's headers (from connecting, or from the
    # last response on a kept-alive connection) and, separately, its body; then it is closed / 408
    timeout: float = 60.0
    # while slots generate, a step holds only the prompt tokens that keep it within this many decode
    # steps' time (0: whole micro-batches)
    max_itl_ratio: float = 2.0
    embeddings: bool = False         # /v1/embeddings and /embedding answer (llama-server's --embeddings)
    pooling: str | None = None       # none, mean, cls, last (None: the file's {arch}.pooling_type, else none)
    reasoning_format: str = "auto"   # llama-server's --reasoning-format: none | deepseek | auto
    reasoning_budget: int = -1       # -1: unlimited; 0: thinking off (enable_thinking=false); N: N thinking tokens
    reasoning_budget_message: str = ""   # forced before the close of a block that ran out of budget
    responses_store_max: int = 1000      # /v1/responses responses kept (the oldest dropped past it)
    responses_store_ttl: float = 3600.0  # seconds a /v1/responses response is kept
    cache_ram: int = 8192            # MiB of host RAM for the prompt cache (-1: no limit, 0: off)
    slot_save_path: str | None = None   # the folder of POST /slots/{id}?action=save|restore files (None: refused)
    allow_image_urls: bool = False          # fetch images given by http(s) URL (image_fetch.py)
    allow_private_image_urls: bool = False  # ... from loopback, private and link-local addresses too
    image_url_max_bytes: int = 10 << 20     # one fetched image's bytes at most (llama-server's fixed 10 MB)
    image_url_timeout: float = 10.0         # seconds one image's fetch may take, redirects included

    @property
    def cache_ram_bytes(self) -> int | None:
        """The prompt cache's limit in bytes (None: no limit)."""
        return None if self.cache_ram < 0 else self.cache_ram << 20


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:   # a test's state, made ready outside the loop (its tokenizer never needs one)
        return None


class ServerState:
    def __init__(self, config: ServerConfig, version: str = ""):
        self.config = config
        self.version = version
        self.status = LOADING
        self.metrics = Metrics()
        self.scheduler = None
        self.started = int(time.time())
        self.model_name = config.model_name
        self.defaults = SamplingParams()
        self.sandbox = Sandbox()   # renders templates, compiles grammars

    def ready(self, backend) -> None:
        """Called on the event loop once the scheduler thread has loaded the model."""
        self.model, self.engine = backend.model, backend.engine
        self.tokenizer = backend.model.tokenizer
        self.request_tokenizer = RequestTokenizer(self.tokenizer, self.sandbox, _running_loop())
        self.template = ChatTemplate.from_tokenizer(backend.model.gguf.metadata, self.tokenizer)
        self.syntax = TemplateSyntax.detect(self.template.source)
        kept = set(self.syntax.kept_tokens())
        self.kept_tokens = frozenset(i for i, t in enumerate(self.tokenizer.tokens) if t in kept)
        self.special_markers = special_markers(self.tokenizer.tokens, self.tokenizer.token_types)
        self.n_ctx_slot = backend.engine.n_ctx // self.config.n_parallel
        self.limits = Limits(n_ctx=self.n_ctx_slot, vocab=backend.model.cfg.vocab_size,
                             speculative=getattr(backend, "drafting", None) is not None,
                             n_slots=self.config.n_parallel)
        self.pooling = self.config.pooling or default_pooling(backend.model.gguf.metadata, backend.model.cfg.arch)
        # the most bytes of text one token stands for: a prompt of more bytes than this times the
        # slot cannot fit, whatever its tokens, so it is refused before tokenising
        self.max_token_bytes = max((len(t.encode("utf-8", "surrogatepass")) for t in self.tokenizer.tokens),
                                   default=1) or 1
        if self.status == LOADING:
            self.status = READY

    def constraints(self, grammar: str, n: int) -> list[Constraint]:
        """The grammar state of each of a request's n choices, over llguidance's view of the
        tokenizer (built at the first grammar: about a second for a vocabulary of 50k); run in
        a request's thread, not the scheduler's."""
        try:
            first = Constraint(grammar_tokenizer(self.tokenizer, self.model.cfg.vocab_size), grammar)
            first.mask()   # a grammar no first token of this vocabulary fits is refused here
        except GrammarError as exc:
            raise BadRequest(f"the grammar was refused: {exc}") from None
        return [first] + [first.copy() for _ in range(n - 1)]
