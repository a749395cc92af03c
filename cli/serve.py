"""`vkrt serve`: an OpenAI- and llama-server-compatible HTTP server for a GGUF model."""

from __future__ import annotations

import asyncio
import logging
import os

import click

from vkrt.server.image_parts import MAX_IMAGE_BYTES
from vkrt.units import fmt_bytes

from .common import (
    FiniteFloat,
    check_device_options,
    count,
    mmproj_options,
    model_options,
    open_drafting,
    open_engine,
    settings,
    spec_options,
    take_model,
    take_spec,
    verify_tokens,
)

log = logging.getLogger("vkrt.server")


def host_allow_list(spec: str | None, bind: str) -> tuple[str, ...] | None:
    """--allowed-hosts as names (lower case, no port); None: any host."""
    from vkrt.server.app import loopback

    if spec is None:
        return ("localhost", "127.0.0.1", "::1") if loopback(bind) else None
    names = tuple(n.strip().lower().strip("[]") for n in spec.split(",") if n.strip())
    if not names:
        raise click.BadParameter("give at least one host name, or '*' for any", param_hint="--allowed-hosts")
    return None if "*" in names else names


@click.command()
@model_options
@mmproj_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on (0: any free port; the log says which).")
@click.option("-np", "--parallel", "n_parallel", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Slots: requests generated at once; each slot gets ctx-size / parallel KV cells.")
@click.option("--api-key", envvar="VKRT_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on every endpoint but /health (env VKRT_API_KEY).")
@click.option("-a", "--alias", default=None, help="Model name reported to clients (default: the file name).")
@click.option("--body-limit", type=count(1024), default=8 << 20, show_default=True,
              help="Largest request body in bytes.")
@click.option("--ctx-checkpoints", type=click.IntRange(0, 64), default=4, show_default=True,
              help="Recurrent-state checkpoints each slot keeps in host memory for prompt-prefix reuse "
                   "(models with DeltaNet layers, e.g. qwen35; 0: reuse only the live state).")
@click.option("--cache-ram", "-cram", "cache_ram", type=click.IntRange(-1, None), default=8192, show_default=True,
              metavar="MiB",
              help="Host RAM for the prompt cache, as llama-server's: a slot taken by another session is copied there "
                   "(its tokens' KV cells and, for models with DeltaNet layers, its recurrent-state checkpoints) and "
                   "a later prompt sharing its prefix resumes from it; least recently used first out. -1: no limit, "
                   "0: off.")
@click.option("--slot-save-path", type=click.Path(exists=True, file_okay=False, writable=True), default=None,
              help="Folder for POST /slots/{id}?action=save|restore (a slot's tokens and KV cells in a file); "
                   "without it slot actions answer 501.")
@click.option("--allowed-hosts", default=None, metavar="LIST",
              help="Host header names requests may carry, comma-separated ('*': any). Default: on a loopback "
                   "address localhost, 127.0.0.1 and ::1 only (a web page cannot reach the server through DNS "
                   "rebinding); elsewhere any.")
@click.option("--shutdown-timeout", type=FiniteFloat(0), default=10.0, show_default=True,
              help="Seconds in-flight requests may take to finish on SIGINT/SIGTERM before they are cancelled.")
@click.option("-to", "--timeout", type=FiniteFloat(0.1), default=60.0, show_default=True,
              help="Seconds a client has to send a request's headers (after connecting, or after the last "
                   "answer on a kept-alive connection: then the connection is closed), and then its body "
                   "(else 408). Generation time does not count.")
@click.option("--max-itl-ratio", type=FiniteFloat(0), default=2.0, show_default=True,
              help="While slots generate, a step holds only as much pending prompt as keeps its time within this "
                   "many decode steps' (both measured as the server runs), so a long prompt arriving raises the "
                   "other streams' inter-token latency about this much at most (a step always reads some prompt: "
                   "up to the next multiple of 64 tokens). 0: no limit, whole micro-batches (-ub) of prompt. Not "
                   "applied (the server's log says so) where experts live in host memory (a step carrying prompt "
                   "streams them whatever its size) or the model keeps a recurrent state: whole micro-batches, "
                   "one an iteration while slots generate.")
@click.option("--embeddings", "--embedding", "embeddings", is_flag=True,
              help="Answer /v1/embeddings and /embedding (the final hidden states after the output norm, pooled by "
                   "--pooling and L2-normalised; without this flag they answer 501, as llama-server's).")
@click.option("--pooling", type=click.Choice(["none", "mean", "cls", "last", "rank"]), default=None,
              help="How an input's token states become its embedding (default: the file's {arch}.pooling_type, "
                   "else none as llama.cpp: /v1/embeddings then refuses, /embedding returns every token's).")
@click.option("--reasoning-format", type=click.Choice(["none", "deepseek", "auto"]), default="auto", show_default=True,
              help="Chat replies' reasoning (<think>...</think>, gpt-oss's analysis channel): none leaves it in "
                   "'content'; deepseek and auto put it in 'reasoning_content' (a request's 'reasoning_format' "
                   "overrides).")
@click.option("--reasoning-budget", type=click.IntRange(-1, 1 << 30), default=-1, show_default=True,
              help="Thinking allowed: -1 unlimited, 0 none (the chat template gets enable_thinking=false unless a "
                   "request's chat_template_kwargs says otherwise), N: at most N tokens in a <think> block, then "
                   "it is closed and the answer follows (a request's reasoning_budget_tokens overrides).")
@click.option("--reasoning-budget-message", default="", metavar="TEXT",
              help="Text forced into a <think> block that ran out of --reasoning-budget, before its close (e.g. "
                   "\"... I have to give the answer now.\"), as llama-server's (a request's reasoning_budget_message "
                   "overrides). Default: none.")
@click.option("--responses-store-max", type=count(1), default=1000, show_default=True, metavar="N",
              help="/v1/responses responses kept in memory for previous_response_id and GET /v1/responses/{id}; "
                   "the oldest is dropped past N.")
@click.option("--responses-store-ttl", type=FiniteFloat(0, min_open=True), default=3600.0, show_default=True,
              metavar="SECONDS", help="Seconds a /v1/responses response is kept in memory.")
@click.option("--allow-image-urls", is_flag=True,
              help="Fetch images given by http(s) URL in requests (chat image_url parts, Responses input_image, "
                   "Anthropic url image sources, /completion multimodal_data), as llama-server always does; "
                   "without it such a request is a 400 and images go inline as data URLs. A request's images are "
                   "fetched at once; only an image Content-Type is taken, and at most 5 redirects are followed.")
@click.option("--allow-private-image-urls", is_flag=True,
              help="With --allow-image-urls: also fetch from hosts that resolve to loopback, private or link-local "
                   "addresses. Off by default as an SSRF guard: a client must not make the server reach its own "
                   "network (localhost services, cloud metadata at 169.254.169.254, the LAN).")
@click.option("--image-url-max-bytes", type=count(1, MAX_IMAGE_BYTES), default=10 << 20, show_default=True,
              metavar="BYTES", help="Largest image fetched by URL (its Content-Length, then the bytes as they come); "
                                    "a larger one is a 400.")
@click.option("--image-url-timeout", type=FiniteFloat(0, min_open=True), default=10.0, show_default=True,
              metavar="SECONDS", help="Seconds one image's fetch may take, redirects and body included (else a 400).")
@click.option("--pipeline-steps", is_flag=True,
              help="With a layer split over several devices: a step of several slots runs as groups of slots "
                   "pipelined over the devices (group g on device k while group g+1 runs on device k-1), with "
                   "the same results; it pays where a device's step time grows with its tokens (many slots, long "
                   "contexts), not where decode only streams the weights.")
@spec_options
@click.pass_context
def serve(ctx, host, port, n_parallel, api_key, alias, body_limit, ctx_checkpoints, cache_ram, slot_save_path,
          allowed_hosts, shutdown_timeout, timeout, max_itl_ratio, embeddings, pooling, reasoning_format,
          reasoning_budget, reasoning_budget_message, responses_store_max, responses_store_ttl, allow_image_urls,
          allow_private_image_urls, image_url_max_bytes, image_url_timeout, pipeline_steps, **model_kw):
    """Serve a GGUF model over HTTP (OpenAI /v1 endpoints, llama-server's /completion)."""
    from vkrt import __version__
    from vkrt.server.app import serve as run_server
    from vkrt.server.backend import load_backend
    from vkrt.server.state import ServerConfig

    if allow_private_image_urls and not allow_image_urls:
        raise click.UsageError("--allow-private-image-urls widens --allow-image-urls: give both")
    if pooling == "rank":
        raise click.BadParameter("rank pooling needs a reranker's classification head, which vkrt does not run",
                                 param_hint="--pooling")
    if model_kw["n_ctx"] // n_parallel < 8:
        raise click.UsageError(f"-c {model_kw['n_ctx']} over --parallel {n_parallel} leaves fewer than 8 cells a slot")
    spec, draft_path, ngld, devd = take_spec(model_kw)
    take_model(model_kw)
    check_device_options(model_kw)
    if pipeline_steps and (model_kw["split_mode"] != "layer" or len((model_kw["device"] or "").split(",")) < 2):
        raise click.UsageError("--pipeline-steps pipelines a step over the devices of a layer split: give several "
                               "devices (--device 0,1) with -sm layer")
    name = alias or os.path.basename(model_kw["model"])
    if logging.getLogger().getEffectiveLevel() > logging.INFO:  # the start-up report shows without -v
        logging.getLogger("vkrt").setLevel(logging.INFO)
    config = ServerConfig(host=host, port=port, n_parallel=n_parallel, api_key=api_key or None, body_limit=body_limit,
                          model_name=name, shutdown_timeout=shutdown_timeout, ctx_checkpoints=ctx_checkpoints,
                          cache_ram=cache_ram, slot_save_path=slot_save_path,
                          allowed_hosts=host_allow_list(allowed_hosts, host), timeout=timeout,
                          max_itl_ratio=max_itl_ratio, embeddings=embeddings, pooling=pooling,
                          reasoning_format=reasoning_format, reasoning_budget=reasoning_budget,
                          reasoning_budget_message=reasoning_budget_message, responses_store_max=responses_store_max,
                          responses_store_ttl=responses_store_ttl, allow_image_urls=allow_image_urls,
                          allow_private_image_urls=allow_private_image_urls, image_url_max_bytes=image_url_max_bytes,
                          image_url_timeout=image_url_timeout)

    run_settings = settings()

    def load():
        path = model_kw["model"]
        size = os.path.getsize(path) if os.path.isfile(path) else None
        log.info("loading %s (%s)", path, fmt_bytes(size))
        return load_backend(lambda devices: open_engine(devices, n_seq_max=n_parallel,
                                                        n_checkpoints=n_parallel * ctx_checkpoints,
                                                        verify_tokens=verify_tokens(spec, n_parallel),
                                                        pipeline_steps=pipeline_steps, **model_kw),
                            model_kw["device"], settings=run_settings,
                            drafting=lambda model, engine, devices: open_drafting(spec, engine, model, draft_path,
                                                                                  ngld, devd))

    ctx.exit(asyncio.run(run_server(load, config, __version__)))
