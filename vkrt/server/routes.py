"""The HTTP endpoints. Generation requests are validated, templated and tokenized here, then
handed to the scheduler as a Job whose events become one JSON body or an SSE stream."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
from dataclasses import asdict

from aiohttp import web

from ..engine.box_rates import cached_box_rates, host_expert_types
from ..engine.dry import breaker_sequences
from ..model.media_prompt import MediaPrompt
from . import body_parse, embeddings, sse
from .anthropic_format import MessagesFormat
from .anthropic_request import parse_messages
from .chat_output import OutputSpec
from .chat_template import encode_chat
from .formats import ChatFormat, CompletionFormat, LlamaFormat
from .generic_tools import GENERIC, prompt_messages
from .image_parts import MEDIA_MARKER
from .image_prompt import check_vision, image_prompt
from .infill import completion_body, infill_prompt
from .jobs import Choice, Done, Failed, Job, Piece
from .metrics import CONTENT_TYPE
from .reasoning import THINK_CLOSE, opens_thinking
from .reasoning_budget import BudgetSpec, budget_spec
from .request_work import in_thread
from .responses_format import ResponsesFormat
from .responses_items import item_page
from .responses_request import parse_responses
from .responses_store import ResponseStore
from .scheduler import SchedulerClosed
from .slot_files import slot_action
from .schemas import COMPLETIONS, LLAMA, GenRequest, parse_chat, parse_completion
from .state import ServerState
from .tool_calls import schemas
from .tool_grammar import MAY_THINK, NO_THINKING, THINKING, constrains
from .validation import ApiError, BadRequest, get_bool, get_str, get_token_ids, parse_json_object

MAX_TOKEN_IDS = 1 << 20   # token ids /tokenize answers and /detokenize takes
MAX_PIECES = 1 << 16      # tokens /tokenize answers with_pieces (an object each, built and written under the GIL)

log = logging.getLogger("vkrt.server")


async def read_body(request: web.Request, state: ServerState) -> dict:
    """The JSON object in the body, which must arrive within --timeout seconds (408 if not),
    parsed off the event loop: in a request thread, or past body_parse.WORKER_BYTES in a sandbox
    worker, where its parse does not hold the GIL the scheduler thread needs."""
    timeout = state.config.timeout
    try:
        async with asyncio.timeout(timeout):
            data = await request.read()
    except TimeoutError:
        raise ApiError(f"the request body did not arrive within {timeout:g} s (--timeout)", status=408,
                       type="timeout_error") from None
    if len(data) <= body_parse.WORKER_BYTES:
        return await in_thread(parse_json_object, data)
    info, numbers = await state.sandbox.call(
        "parse_body", {}, attached=data, what="parsing the request body", field=None,
        seconds=max(state.sandbox.seconds, len(data) / body_parse.SLOWEST_BYTES_PER_SECOND))
    return await in_thread(body_parse.unpack, info, numbers)


async def json_reply(data) -> web.Response:
    """A JSON response serialised off the event loop (token lists run to megabytes)."""
    text = await in_thread(json.dumps, data)
    return web.Response(text=text, content_type="application/json")


class Api:
    def __init__(self, state: ServerState):
        self.state = state
        self._box_rates = None   # read once found (BoxRates)
        # finished /v1/responses responses (previous_response_id, GET / DELETE)
        self.stored = ResponseStore(state.config.responses_store_max, state.config.responses_store_ttl)

    def routes(self) -> list:
        chat, comp = self.chat_completions, self.completions
        return [
            web.get("/health", self.health), web.get("/v1/health", self.health),
            web.get("/v1/models", self.models), web.get("/models", self.models),
            web.get("/props", self.props), web.get("/slots", self.slots), web.get("/metrics", self.metrics),
            web.post("/slots/{id_slot}", functools.partial(slot_action, self.state)),
            web.post("/v1/chat/completions", chat), web.post("/chat/completions", chat),
            web.post("/v1/completions", comp), web.post("/completions", comp),
            web.post("/completion", self.completion),
            web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize),
            web.get("/v1/models/{model_id:.+}", self.model), web.get("/models/{model_id:.+}", self.model),
            web.post("/v1/embeddings", self.embeddings_oai),
            web.post("/embedding", self.embedding), web.post("/embeddings", self.embedding),
            web.post("/apply-template", self.apply_template), web.post("/infill", self.infill),
            web.post("/v1/messages", self.messages), web.post("/v1/messages/count_tokens", self.count_tokens),
            web.post("/v1/responses", self.responses), web.get("/v1/responses/{response_id}", self.response),
            web.delete("/v1/responses/{response_id}", self.delete_response),
            web.get("/v1/responses/{response_id}/input_items", self.response_input_items),
        ]

    # -- information -------------------------------------------------------------------------------
    async def health(self, request):
        """ok, or 503 while a step is stuck (Scheduler.stuck)."""
        scheduler = self.state.scheduler
        stuck = scheduler.stuck() if scheduler is not None else None
        if stuck is not None:
            raise ApiError(stuck, status=503, type="unavailable_error")
        return web.json_response({"status": "ok"})

    async def models(self, request):
        return web.json_response({"object": "list", "data": [self._model_object()]})

    async def model(self, request):
        """OpenAI's model retrieval: the served model by its id, else 404."""
        name = request.match_info["model_id"]
        if name != self.state.model_name:
            raise ApiError(f"The model {name!r} does not exist: this server serves {self.state.model_name!r}",
                           "model", status=404)
        return web.json_response(self._model_object())

    def _model_object(self) -> dict:
        s = self.state
        cfg = s.model.cfg
        meta = {"n_vocab": cfg.vocab_size, "n_ctx_train": cfg.n_ctx_train, "n_embd": cfg.n_embd,
                "n_params": s.model.n_params, "size": s.model.size_bytes}
        caps = ["completion"] + (["multimodal"] if s.engine.vision is not None else [])   # llama-server's names
        return {"id": s.model_name, "object": "model", "created": s.started, "owned_by": "vkrt", "meta": meta,
                "capabilities": caps}

    async def props(self, request):
        s = self.state
        return web.json_response({
            "model_path": os.path.basename(s.model.path), "model_alias": s.model_name, "total_slots": s.config.n_parallel,
            "chat_template": s.template.source, "bos_token": s.template.bos_token, "eos_token": s.template.eos_token,
            "default_generation_settings": {"n_ctx": s.n_ctx_slot, "params": asdict(s.defaults)},
            "modalities": {"vision": s.engine.vision is not None, "audio": False}, "media_marker": MEDIA_MARKER,
            "build_info": f"vkrt {s.version}", **self._box()})

    def _box(self) -> dict:
        """{"box": the box's cached rates} where the model keeps experts in host memory and they
        were measured (at start: vkrt/engine/box_rates.py model_box_rates); else nothing."""
        if self._box_rates is None and host_expert_types(self.state.model):
            self._box_rates = cached_box_rates(self.state.model.device)
        return {"box": self._box_rates.as_dict()} if self._box_rates is not None else {}

    async def slots(self, request):
        return web.json_response(self.state.scheduler.slot_info())

    async def metrics(self, request):
        s = self.state
        processing, deferred = s.scheduler.counts()
        text = s.metrics.render(processing=processing, deferred=deferred, kv_tokens=s.scheduler.kv_tokens(),
                                kv_cells=s.engine.n_ctx, slots=s.config.n_parallel, engine_stats=s.engine.stats)
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    # -- tokens ------------------------------------------------------------------------------------
    async def tokenize(self, request):
        body = await read_body(request, self.state)
        content = get_str(body, "content")
        add_special = get_bool(body, "add_special", False)
        with_pieces = get_bool(body, "with_pieces", False)
        tok = self.state.request_tokenizer

        def tokens():
            ids = tok.encode(content, add_special, field="content")
            if len(ids) > MAX_TOKEN_IDS:
                raise BadRequest(f"'content' is {len(ids)} tokens; /tokenize answers at most {MAX_TOKEN_IDS}",
                                 "content")
            if with_pieces and len(ids) > MAX_PIECES:
                raise BadRequest(f"'content' is {len(ids)} tokens; /tokenize answers at most {MAX_PIECES} with_pieces "
                                 f"(send the text in parts, or without with_pieces)", "with_pieces")
            return [{"id": i, "piece": tok.decode([i])} for i in ids] if with_pieces else ids
        return await json_reply({"tokens": await in_thread(tokens)})

    async def detokenize(self, request):
        body = await read_body(request, self.state)
        raw = body.get("tokens")
        if not isinstance(raw, list):
            raise BadRequest("'tokens' must be an array of token ids", "tokens")
        if len(raw) > MAX_TOKEN_IDS:
            raise BadRequest(f"'tokens' holds {len(raw)} token ids; /detokenize takes at most {MAX_TOKEN_IDS}",
                             "tokens")

        def content():
            return self.state.request_tokenizer.decode(get_token_ids(raw, "tokens", self.state.limits.vocab))
        return await json_reply({"content": await in_thread(content)})

    async def apply_template(self, request):
        """llama-server's /apply-template: the prompt /v1/chat/completions would render."""
        body = await read_body(request, self.state)
        req = await in_thread(parse_chat, body, self.state.limits)
        return await json_reply({"prompt": await self._chat_text(req)})

    # -- embeddings --------------------------------------------------------------------------------
    async def embeddings_oai(self, request):
        return await self._embeddings(request, oai=True)

    async def embedding(self, request):
        return await self._embeddings(request, oai=False)

    async def _embeddings(self, request, oai: bool):
        embeddings.check_enabled(self.state, oai)
        body = await read_body(request, self.state)
        return await json_reply(await embeddings.embed(self.state, body, oai))

    # -- generation --------------------------------------------------------------------------------
    async def chat_completions(self, request):
        body = await read_body(request, self.state)
        req = await in_thread(parse_chat, body, self.state.limits)
        return await self._chat(request, req, lambda i, spec, n: ChatFormat(i, self._model(req), spec))

    async def messages(self, request):
        """Anthropic's Messages API, as a chat request."""
        body = await read_body(request, self.state)
        req = await in_thread(parse_messages, body, self.state.limits)
        return await self._chat(request, req, lambda i, spec, n: MessagesFormat(self._model(req), spec, n))

    async def count_tokens(self, request):
        """Anthropic's token count: the tokens of the prompt /v1/messages would render, each image's
        as many as the projector makes of it (the image is encoded to know)."""
        s = self.state
        body = await read_body(request, s)
        req = await in_thread(parse_messages, body, s.limits, counting=True)
        check_vision(s, req.images)
        text = await self._chat_text(req)
        prompt = (await image_prompt(s, text, req.images) if req.images else
                  await in_thread(encode_chat, s.request_tokenizer, text))
        return web.json_response({"input_tokens": len(prompt)})

    async def responses(self, request):
        """OpenAI's Responses API, as a chat request; finished responses are kept (self.stored)
        unless sent with store false."""
        body = await read_body(request, self.state)
        turn = await in_thread(parse_responses, body, self.state.limits, self.stored)
        keep = ((lambda response, reply: self.stored.put(response, turn.history + [reply], turn.images,
                                                         turn.inputs)) if turn.store else None)
        count = lambda text: len(self.state.tokenizer.encode(text, False))   # noqa: E731
        return await self._chat(request, turn.req, lambda i, spec, n: ResponsesFormat(
            self._model(turn.req), spec, turn.echo, keep, count), "input")

    async def response(self, request):
        return web.json_response(self._stored(request.match_info["response_id"]).response)

    async def response_input_items(self, request):
        """A stored response's input items, a page at a time (responses_items.py)."""
        kept = self._stored(request.match_info["response_id"])
        return web.json_response(item_page(kept.inputs, request.query))

    async def delete_response(self, request):
        response_id = self._stored(request.match_info["response_id"]).response["id"]
        self.stored.delete(response_id)
        return web.json_response({"id": response_id, "object": "response", "deleted": True})

    def _stored(self, response_id: str):
        kept = self.stored.get(response_id)
        if kept is None:
            raise ApiError(f"no response {response_id!r} is kept here (the last {self.stored.max_count} are, for "
                           f"{self.stored.max_age:g} s, but not those sent with store false)", status=404,
                           type="not_found_error")
        return kept

    async def _chat(self, request, req: GenRequest, make_format, field: str = "messages"):
        """A chat request rendered, constrained (tools, grammars) and generated; make_format(job id,
        OutputSpec, prompt tokens) gives the reply's format."""
        s = self.state
        check_vision(s, req.images)   # before the template runs
        text = await self._chat_text(req)
        prompt = (await image_prompt(s, text, req.images, field=field) if req.images else
                  await in_thread(encode_chat, s.request_tokenizer, text))
        thinking_open = s.syntax.thinks and opens_thinking(text)
        if constrains(req.tools, req.tool_choice, s.syntax.tools):
            req.grammar = await s.sandbox.call("tool_grammar", self._tool_grammar_args(req, text, thinking_open),
                                               what="the tools' grammar", field="tools")
        else:
            await self._compile(req)
        spec = OutputSpec(s.syntax, req.reasoning_format or s.config.reasoning_format, thinking_open=thinking_open,
                          parse_tools=self._offered_tools(req) is not None,
                          parallel_tool_calls=req.parallel_tool_calls, tools=schemas(req.tools))
        budget = self._budget(req)
        message = req.budget_message if req.budget_message is not None else s.config.reasoning_budget_message
        thinking = (budget_spec(budget, s.request_tokenizer, thinking_open, message)
                    if budget >= 0 and s.syntax.thinks else None)
        return await self._generate(request, req, prompt, lambda i: make_format(i, spec, len(prompt)), field,
                                    keep_special=s.kept_tokens, reasoning_budget=thinking)

    def _budget(self, req: GenRequest) -> int:
        """The request's thinking tokens allowed (-1: no limit)."""
        return req.reasoning_budget if req.reasoning_budget is not None else self.state.config.reasoning_budget

    def _tool_grammar_args(self, req: GenRequest, prompt: str, thinking_open: bool) -> dict:
        """tool_grammar's arguments: the grammar of a reply held to tool calls (tool_choice
        required or named, strict functions)."""
        s = self.state
        thinking = (THINKING if thinking_open else MAY_THINK if s.syntax.thinks and not prompt.rstrip().endswith(
            THINK_CLOSE) else NO_THINKING)
        src = req.grammar_source
        return {"fmt": s.syntax.tools, "tools": req.tools, "choice": req.tool_choice, "name": req.tool_name,
                "parallel": req.parallel_tool_calls, "thinking": thinking, "specials": s.special_markers,
                "response": None if src is None else {"kind": src.kind, "source": src.source, "field": src.field}}

    async def _compile(self, req: GenRequest) -> None:
        """req.grammar from its source (response_format, json_schema, grammar), compiled in a sandbox."""
        src = req.grammar_source
        if src is not None:
            req.grammar = await self.state.sandbox.call("grammar", {"kind": src.kind, "source": src.source,
                                                                    "field": src.field},
                                                        what=f"'{src.field}'", field=src.field)


    async def completions(self, request):
        body = await read_body(request, self.state)
        req = await in_thread(parse_completion, body, COMPLETIONS, self.state.limits)
        prompt = await self._prompt(req)
        await self._compile(req)
        return await self._generate(request, req, prompt, lambda i: CompletionFormat(i, self._model(req)), "prompt")

    async def completion(self, request):
        return await self._completion(request, await read_body(request, self.state))

    async def infill(self, request):
        """llama-server's fill-in-the-middle: /completion of the prompt the FIM tokens frame."""
        body = await read_body(request, self.state)
        tokens = await in_thread(infill_prompt, self.state, body)
        return await self._completion(request, completion_body(body, tokens))

    async def _completion(self, request, body: dict):
        req = await in_thread(parse_completion, body, LLAMA, self.state.limits)
        prompt = await self._prompt(req)
        await self._compile(req)
        settings = {"n_ctx": self.state.n_ctx_slot, "n_predict": -1 if req.max_tokens is None else req.max_tokens,
                    "stream": req.stream, "stop": req.stop, "ignore_eos": req.ignore_eos,
                    "cache_prompt": req.cache_prompt, **asdict(req.params)}
        return await self._generate(
            request, req, prompt, lambda i: LlamaFormat(i, self._model(req), req.prompt, settings, req.return_tokens),
            "prompt")

    def _model(self, req: GenRequest) -> str:
        return req.model or self.state.model_name

    def _fits(self, text: str, field: str) -> None:
        """Refuse, before tokenising, a text too long for a slot whatever its tokens."""
        s = self.state
        n = len(text.encode("utf-8"))
        if n > s.max_token_bytes * s.n_ctx_slot:
            raise BadRequest(f"the prompt is {n} bytes; at most {s.max_token_bytes} bytes a token, it cannot fit a "
                             f"slot of {s.n_ctx_slot} tokens: shorten the prompt or raise -c", field)

    def _messages_fit(self, req: GenRequest) -> None:
        for m in req.messages:
            if isinstance(m.get("content"), str):
                self._fits(m["content"], "messages")

    @staticmethod
    def _offered_tools(req: GenRequest) -> list | None:
        """The tools the template shows the model (none with tool_choice "none")."""
        return req.tools if req.tool_choice != "none" else None

    async def _chat_text(self, req: GenRequest) -> str:
        """The rendered chat prompt, rendered in a sandbox (the template is the model file's code)."""
        s = self.state
        await in_thread(self._messages_fit, req)
        defaults = {"enable_thinking": False} if self._budget(req) == 0 else {}
        limit = s.max_token_bytes * s.n_ctx_slot
        t = s.template
        messages, tools = req.messages, self._offered_tools(req)
        if tools and s.syntax.tools == GENERIC:   # llama-server's generic format: a JSON reply, asked for
            messages = prompt_messages(messages, tools, t.source, req.parallel_tool_calls)
        args = {"source": t.source, "bos": t.bos_token, "eos": t.eos_token, "messages": messages,
                "tools": tools, "extra": {**defaults, **req.template_kwargs}, "max_bytes": limit,
                "too_long": f"the rendered prompt is over {limit} bytes; at most {s.max_token_bytes} bytes a token, "
                            f"it cannot fit a slot of {s.n_ctx_slot} tokens: shorten the prompt or raise -c"}
        return await s.sandbox.call("render", args, what="the chat template", field="messages")

    async def _prompt(self, req: GenRequest) -> list[int] | MediaPrompt:
        """A completion request's prompt: its tokens, or with images (/completion's
        multimodal_data) a MediaPrompt."""
        if not req.images:
            return await in_thread(self._text_prompt, req)
        check_vision(self.state, req.images)
        self._fits(req.prompt, "prompt")
        return await image_prompt(self.state, req.prompt, req.images, field="prompt")

    def _text_prompt(self, req: GenRequest) -> list[int]:
        if isinstance(req.prompt, list):
            return req.prompt
        self._fits(req.prompt, "prompt")
        return self.state.request_tokenizer.encode(req.prompt, add_special=True)

    async def _generate(self, request, req: GenRequest, prompt: list[int] | MediaPrompt, make_format, field: str,
                        keep_special: frozenset[int] = frozenset(), reasoning_budget: BudgetSpec | None = None):
        s = self.state
        images, prompt = (prompt.images, prompt.tokens) if isinstance(prompt, MediaPrompt) else ([], prompt)
        if not prompt:
            raise BadRequest(f"'{field}' is empty: no tokens to evaluate", field)
        if len(prompt) >= s.n_ctx_slot:
            raise BadRequest(f"the prompt is {len(prompt)} tokens long; a slot holds {s.n_ctx_slot} tokens "
                             f"(-c {s.engine.n_ctx} over --parallel {s.config.n_parallel}) and needs room for at "
                             f"least one generated token: shorten the prompt or raise -c", field)
        params = req.params
        if params.dry:   # the breakers as token sequences (the first time for a set: a pass over the vocabulary)
            seqs = await in_thread(breaker_sequences, s.tokenizer, req.dry_sequence_breakers)
            params = dataclasses.replace(params, dry_breakers=seqs)
        # one job a choice (OpenAI's n); a seeded request seeds its choices seed, seed + 1, ...
        constraints = (await in_thread(s.constraints, req.grammar, req.n) if req.grammar is not None
                       else [None] * req.n)
        jobs = [Job(prompt, req.max_tokens, params if params.seed is None or i == 0 else
                    dataclasses.replace(params, seed=params.seed + i), req.stop, req.ignore_eos, req.cache_prompt,
                    req.logprobs, keep_special, constraint=constraints[i], draft=req.draft,
                    reasoning_budget=reasoning_budget, images=images,
                    timings_per_token=req.timings_per_token, id_slot=req.id_slot) for i in range(req.n)]
        fmt = make_format(jobs[0].id)
        submitted = []
        try:
            for job in jobs:
                s.scheduler.submit(job)
                submitted.append(job)
        except SchedulerClosed as exc:
            for job in submitted:
                s.scheduler.cancel(job)
            raise ApiError(str(exc), status=503, type="unavailable_error") from None
        s.metrics.requests += 1
        finished = False
        try:
            if req.stream:
                resp, dones, finished = await sse.stream(request, jobs, fmt, req.include_usage)
                for job, done in zip(jobs, dones or ()):
                    self._log(job, done)
                return resp
            choices = await asyncio.gather(*(self._collect(job) for job in jobs))
            finished = True
            for job, choice in zip(jobs, choices):
                self._log(job, choice.done)
            return await json_reply(fmt.result(choices))
        finally:
            if not finished:
                for job in jobs:
                    s.scheduler.cancel(job)

    async def _collect(self, job: Job) -> Choice:
        text, tokens, probs = [], [], []
        while True:
            ev = await job.next_event()
            if isinstance(ev, Piece):
                text.append(ev.text)
                tokens.extend(ev.tokens)
                probs.extend(ev.probs)
            elif isinstance(ev, Done):
                return Choice("".join(text), tokens, ev, probs)
            elif isinstance(ev, Failed):
                raise ApiError(ev.message, status=ev.status, type=ev.type)

    def _log(self, job: Job, done: Done) -> None:
        t = done.timings
        drafts = f" ({t.draft_n_accepted} of {t.draft_n} drafts accepted)" if t.draft_n else ""
        log.info("request %d on slot %d: prompt %d tokens (%d cached) %.1f t/s, generated %d tokens %.1f t/s%s, %s",
                 job.id, done.slot, done.prompt_tokens, done.cached_tokens, t.prompt_per_second,
                 done.completion_tokens, t.predicted_per_second, drafts, done.stop_type)
