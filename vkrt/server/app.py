"""The aiohttp application and its life: listen at once (/health answers 503 while the model
loads), serve, and on SIGINT/SIGTERM stop taking requests, let in-flight ones finish for up to
shutdown_timeout seconds (a second signal cancels them at once), then close everything."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import signal
import threading

from aiohttp import web

from ..errors import ConfigError
from . import anthropic_format
from .routes import Api
from .scheduler import Scheduler
from .state import FAILED, LOADING, READY, STOPPING, ServerConfig, ServerState
from .validation import ApiError

log = logging.getLogger("vkrt.server")

PUBLIC = ("/health", "/v1/health")
GRACE = 20.0   # seconds past --shutdown-timeout a stop may take (closing the HTTP side, workers, the device)


def error_body(status: int, message: str, type: str, param: str | None = None) -> dict:
    err = {"code": status, "message": message, "type": type}
    if param is not None:
        err["param"] = param
    return {"error": err}


def make_app(state: ServerState) -> web.Application:
    key = state.config.api_key

    @web.middleware
    async def errors(request, handler):
        try:
            return await handler(request)
        except ApiError as exc:
            status, body = exc.status, error_body(exc.status, exc.message, exc.type, exc.param)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            status = exc.status
            body = error_body(status, _http_message(exc, request, state), "invalid_request_error")
        except Exception:  # a bug: log it with its traceback, answer without one
            log.exception("%s %s failed", request.method, request.path)
            status, body = 500, error_body(500, "internal error (the server log has the details)", "server_error")
        if 400 <= status < 500:
            state.metrics.bad_requests += 1
        if request.path == "/v1/messages" or request.path.startswith("/v1/messages/"):   # Anthropic's shape
            body = anthropic_format.error_body(status, body["error"]["message"])
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        resp = web.json_response(body, status=status, headers=headers)
        if status == 413:   # the rest of the body is not wanted: no next request on this connection
            resp.force_close()
        return resp

    @web.middleware
    async def gate(request, handler):
        if request.path in PUBLIC:
            if state.status != READY:
                why = {LOADING: "Loading model", STOPPING: "Shutting down", FAILED: "The model failed to load"}
                raise ApiError(why[state.status], status=503, type="unavailable_error")
            return await handler(request)
        allowed = state.config.allowed_hosts
        if allowed is not None and _host_name(request) not in allowed:
            raise ApiError(f"Host {request.headers.get('Host', '')!r} is not one this server answers to "
                           f"(--allowed-hosts)", status=403, type="permission_error")
        if request.method == "POST" and request.match_info.http_exception is None:
            _check_json_body(request, state.config.body_limit)
        if key is not None and not _authorized(request, key):
            raise ApiError("Invalid API Key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'", status=401,
                           type="authentication_error")
        if state.status == LOADING:
            raise ApiError("Loading model", status=503, type="unavailable_error")
        if state.status != READY:
            raise ApiError("The server is shutting down", status=503, type="unavailable_error")
        return await handler(request)

    app = web.Application(middlewares=[errors, gate], client_max_size=state.config.body_limit)
    app.add_routes(Api(state).routes())
    return app


def _check_json_body(request, limit: int) -> None:
    """Refuse a POST, from its headers alone, whose body is not declared JSON (415: a web page's
    plain cross-origin POST sends none or a form type) or says it is over `limit` bytes (413)."""
    declared = request.headers.get("Content-Type", "").strip()
    if not declared or request.content_type != "application/json":
        got = f"Content-Type {request.content_type!r}" if declared else "no Content-Type header"
        raise ApiError(f"the request body must be JSON sent with Content-Type: application/json (curl: "
                       f"-H 'Content-Type: application/json'), got {got}", status=415)
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(f"the request body is larger than {limit} bytes (--body-limit): its Content-Length "
                       f"says {request.content_length}", status=413)


def _host_name(request) -> str:
    """The Host header's name, lower case, without port or IPv6 brackets."""
    host = request.headers.get("Host", "").strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _authorized(request, key: str) -> bool:
    auth = request.headers.get("Authorization", "")
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("X-Api-Key", "")
    # headers arrive as latin-1 text; compare bytes (a header that is no valid key is just wrong)
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), key.encode("utf-8", "surrogateescape"))


def loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _http_message(exc: web.HTTPException, request, state: ServerState) -> str:
    if exc.status == 413:
        return f"the request body is larger than {state.config.body_limit} bytes (--body-limit)"
    if exc.status == 404:
        return f"no endpoint {request.path}"
    if exc.status == 405:
        return f"{request.method} is not allowed on {request.path}"
    return exc.reason


async def serve(load, config: ServerConfig, version: str = "") -> int:
    """Run the server until a signal; returns the exit status (1 when the model failed to load)."""
    loop = asyncio.get_running_loop()
    state = ServerState(config, version)
    stop, force = asyncio.Event(), asyncio.Event()
    outcome = {"rc": 0}
    background = set()   # tasks kept alive until done

    def on_ready(backend):
        try:
            state.ready(backend)
            for line in backend.report(config.n_parallel):
                log.info("%s", line)
        except Exception as exc:
            log.exception("setting up after the model loaded failed")
            on_failed(exc)
            return
        log.info("ready: model %r, %d slot(s)", state.model_name, config.n_parallel)
        background.add(loop.create_task(state.sandbox.start()))

    def on_failed(exc):
        state.status = FAILED
        log.error("%s", exc if str(exc) else type(exc).__name__)
        outcome["rc"] = 1
        stop.set()

    state.scheduler = scheduler = Scheduler(
        load, config.n_parallel, state.metrics,
        on_ready=lambda b: loop.call_soon_threadsafe(on_ready, b),
        on_failed=lambda e: loop.call_soon_threadsafe(on_failed, e), ctx_checkpoints=config.ctx_checkpoints,
        max_itl_ratio=config.max_itl_ratio, cache_ram=config.cache_ram_bytes)
    # access lines go to the aiohttp.access logger: shown with -v
    # keepalive_timeout: aiohttp closes a connection whose next request's headers are not complete
    # that long after it connected or was last answered (a half-open or trickling client)
    runner = web.AppRunner(make_app(state), handle_signals=False, handler_cancellation=True,
                           access_log=logging.getLogger("aiohttp.access"), shutdown_timeout=5.0,
                           keepalive_timeout=config.timeout)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    host, port = runner.addresses[0][:2]
    log.info("listening on http://%s:%d (loading the model)", f"[{host}]" if ":" in host else host, port)
    if config.api_key is None and not loopback(config.host):
        log.warning("listening on %s without --api-key: anyone who reaches this port can use the server", config.host)

    def hard_exit():   # armed by the first signal; also covers what hangs after serve() returns
        log.error("the server did not stop within %.0f s of the signal: exiting now", config.shutdown_timeout + GRACE)
        log.info("stopped")
        logging.shutdown()
        os._exit(outcome["rc"] or 1)

    def on_signal(sig):
        if not stop.is_set():   # whatever hangs (a GPU step, a thread), the process ends in bounded time
            watchdog.start()
        if stop.is_set():
            log.info("%s again: cancelling in-flight requests", sig.name)
            force.set()
            scheduler.cancel_all()
        else:
            log.info("%s: finishing in-flight requests (up to %.0f s), then exiting", sig.name,
                     config.shutdown_timeout)
            stop.set()

    watchdog = threading.Timer(config.shutdown_timeout + GRACE, hard_exit)
    watchdog.daemon = True
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        scheduler.start()
        await stop.wait()
        if state.status != FAILED:
            state.status = STOPPING
        scheduler.stop_accepting()
        deadline = loop.time() + config.shutdown_timeout
        while scheduler.busy and loop.time() < deadline and not force.is_set():
            await asyncio.sleep(0.05)
        if scheduler.busy:
            log.info("cancelling the requests still running")
            scheduler.cancel_all()
        await runner.cleanup()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await state.sandbox.close()
        await asyncio.to_thread(scheduler.close, GRACE / 2)
        if scheduler.alive:
            log.warning("the scheduler thread did not end within %.0f s (a device step hung?): exiting without "
                        "closing the device", GRACE / 2)
    log.info("stopped")
    return outcome["rc"]
