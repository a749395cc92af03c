"""Images by http(s) URL (`vkrt serve --allow-image-urls`): fetched from a local aiohttp image host
they answer as the same image sent as a data URL does (chat, Anthropic url sources, Responses,
/completion), a request's images fetched at once, and each failure a 400 naming the field and
why (timeout, too large by Content-Length or by count, HTTP status, not an image type, a redirect
loop); a client that goes away cancels the fetch; without the flag a URL is refused naming it;
without --allow-private-image-urls a loopback or private host is refused, however written."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import threading
import time

import anthropic
import openai
import pytest
from aiohttp import web
from click.testing import CliRunner
from models import tiny_model

from vision_cases import TEXT_MODEL, image_png, mmproj_file
from vkrt.cli.main import cli
from vkrt.server.image_fetch import fetch_images
from vkrt.server.image_parts import ImageUrl
from vkrt.server.state import ServerConfig
from vkrt.server.validation import BadRequest

from .serverproc import API_KEY, serving, wait_idle

PNG = image_png(64, 128, 1)
OTHER = image_png(64, 128, 5)
MAX_BYTES = 40_000             # --image-url-max-bytes: above PNG's size
TIMEOUT = 3.0                  # --image-url-timeout
IMAGE_TOKENS = 8 + 13 + 12     # the 64x128 image's tokens and its frame as text in the tiny vocabulary
QUESTION = "What is this?"
FIELD = "messages[0].content[1].image_url.url"


class ImageHost:
    """An aiohttp server on 127.0.0.1 in its own thread: the endpoints the tests fetch from,
    counting the requests each path got and when a slow answer's reader went away."""

    def __init__(self):
        self.hits: dict[str, int] = {}
        self.started: dict[str, threading.Event] = {}
        self.ended: dict[str, float] = {}
        self._pair = None
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        assert ready.wait(10), "the image host did not start"

    def _run(self, ready):
        asyncio.set_event_loop(self._loop)
        app = web.Application(middlewares=[self._count])
        app.add_routes([web.get("/cat.png", self._png(PNG)), web.get("/other.png", self._png(OTHER)),
                        web.get("/pair.png", self._pair_png), web.get("/slow.png", self._slow),
                        web.get("/big.png", self._big), web.get("/stream.png", self._stream),
                        web.get("/loop", self._loop_redirect), web.get("/hop", self._hop),
                        web.get("/page", self._page), web.get("/to", self._to)])
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        ready.set()
        self._loop.run_forever()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    @web.middleware
    async def _count(self, request, handler):
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        return await handler(request)

    @staticmethod
    def _png(data: bytes):
        async def handler(request):
            return web.Response(body=data, content_type="image/png")
        return handler

    async def _pair_png(self, request):
        """Answers only once two requests for it are in flight together (else 503 after 2 s)."""
        if self._pair is None:
            self._pair = asyncio.Barrier(2)
        try:
            async with asyncio.timeout(2.0):
                await self._pair.wait()
        except TimeoutError:
            self._pair = None
            return web.Response(status=503, text="fetched alone")
        return web.Response(body=PNG, content_type="image/png")

    async def _slow(self, request):
        """An image that never finishes: a byte every 50 ms; `ended[id]` is when its reader left."""
        key = request.query.get("id", "")
        resp = web.StreamResponse(headers={"Content-Type": "image/png"})
        await resp.prepare(request)
        self.started.setdefault(key, threading.Event()).set()
        try:
            for _ in range(1200):
                await resp.write(b"\x89")
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.CancelledError):
            self.ended[key] = time.monotonic()
            raise
        return resp

    async def _big(self, request):
        return web.Response(body=bytes(MAX_BYTES + 1), content_type="image/png")

    async def _stream(self, request):
        """Over the limit without a Content-Length: chunked, counted as it comes."""
        resp = web.StreamResponse(headers={"Content-Type": "image/png"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(8):
            await resp.write(bytes(MAX_BYTES // 4))
        await resp.write_eof()
        return resp

    async def _loop_redirect(self, request):
        raise web.HTTPFound("/loop")

    async def _hop(self, request):
        raise web.HTTPFound("/cat.png")

    async def _page(self, request):
        return web.Response(text="<html>not a picture</html>", content_type="text/html")

    async def _to(self, request):
        raise web.HTTPFound(request.query["url"])


@pytest.fixture(scope="module")
def host():
    h = ImageHost()
    yield h
    h.close()


@pytest.fixture(scope="module")
def url_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("image-urls")
    model, mmproj = tiny_model(TEXT_MODEL, folder), mmproj_file(folder)
    yield from serving(model, "--mmproj", mmproj, "-c", "1024", "-np", "2", "-ub", "64", "--body-limit",
                       str(1 << 20), "--allow-image-urls", "--allow-private-image-urls",
                       "--image-url-max-bytes", str(MAX_BYTES), "--image-url-timeout", str(TIMEOUT))


def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def chat(server, *urls: str, max_tokens: int = 4):
    parts = [{"type": "text", "text": QUESTION}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    out = oai(server).chat.completions.create(model="x", max_tokens=max_tokens, temperature=0,
                                              messages=[{"role": "user", "content": parts}])
    wait_idle(server)
    msg = out.choices[0].message
    return (getattr(msg, "reasoning_content", None) or "") + (msg.content or ""), out.usage.prompt_tokens


def test_url_image_answers_as_its_data_url(url_server, host):
    """The fetched bytes take the data URL's path: the same answer and prompt tokens, and one
    redirect is followed."""
    want = chat(url_server, data_url(PNG))
    assert chat(url_server)[1] + IMAGE_TOKENS == want[1]
    before = host.hits.get("/cat.png", 0), host.hits.get("/hop", 0)
    assert chat(url_server, host.url("/cat.png")) == want
    assert chat(url_server, host.url("/hop")) == want
    assert (host.hits["/cat.png"], host.hits["/hop"]) == (before[0] + 2, before[1] + 1)


def test_images_fetch_at_once(url_server, host):
    """/pair.png answers only while two fetches of it are in flight together."""
    _, tokens = chat(url_server, host.url("/pair.png"), host.url("/pair.png"), max_tokens=1)
    assert tokens == chat(url_server, max_tokens=1)[1] + 2 * IMAGE_TOKENS


def test_anthropic_url_source_and_completion(url_server, host):
    want = chat(url_server, data_url(OTHER))
    client = anthropic.Anthropic(base_url=url_server.url, api_key=API_KEY, max_retries=0, timeout=60)
    ask = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                        {"type": "image", "source": {"type": "url", "url": host.url("/other.png")}}]}]
    assert client.messages.count_tokens(model="x", messages=ask).input_tokens == want[1]
    status, props = url_server.get("/props")
    mark = json.loads(props)["media_marker"]
    body = {"prompt": {"prompt_string": "Look: " + mark, "multimodal_data": [host.url("/other.png")]},
            "n_predict": 1, "temperature": 0, "cache_prompt": False}
    status, out = url_server.post("/completion", body)
    assert status == 200, out
    wait_idle(url_server)
    body["prompt"]["multimodal_data"] = [base64.b64encode(OTHER).decode()]
    status, inline = url_server.post("/completion", body)
    wait_idle(url_server)
    assert out["content"] == inline["content"] and out["timings"]["prompt_n"] == inline["timings"]["prompt_n"]


def test_responses_keep_the_fetched_bytes(url_server, host):
    """A kept Responses conversation holds the image's bytes: the next turn fetches nothing."""
    client = oai(url_server)
    out = client.responses.create(model="x", max_output_tokens=2, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": host.url("/other.png")},
                                     {"type": "input_text", "text": QUESTION}]}])
    wait_idle(url_server)
    hits = host.hits["/other.png"]
    more = client.responses.create(model="x", max_output_tokens=1, previous_response_id=out.id, input="And?")
    wait_idle(url_server)
    assert host.hits["/other.png"] == hits and more.usage.input_tokens > out.usage.input_tokens


@pytest.mark.parametrize("path, why", [
    ("/slow.png?id=timeout", rf"no whole answer within {TIMEOUT:g} s \(--image-url-timeout\)"),
    ("/big.png", rf"larger than {MAX_BYTES} bytes \(--image-url-max-bytes\): its Content-Length says {MAX_BYTES + 1}"),
    ("/stream.png", rf"larger than {MAX_BYTES} bytes \(--image-url-max-bytes\)$"),
    ("/missing.png", "HTTP 404 Not Found"),
    ("/page", "not an image: its Content-Type is 'text/html'"),
    ("/loop", "more than 5 redirects"),
    ("/to?url=ftp://127.0.0.1/a.png", "only http and https URLs are fetched"),
])
def test_fetch_failures(url_server, host, path, why):
    with pytest.raises(openai.BadRequestError) as err:
        chat(url_server, host.url(path), max_tokens=1)
    body = err.value.body
    assert err.value.status_code == 400 and body["param"] == FIELD
    assert body["message"].startswith(f"'{FIELD}': the image at {host.url(path)} could not be fetched: ")
    assert re.search(why, body["message"]), body["message"]


def test_client_disconnect_cancels_the_fetch(url_server, host):
    """The request's connection closed mid-fetch: the image host sees its reader go well before
    the timeout would have ended it, and the server answers on."""
    body = json.dumps({"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": host.url("/slow.png?id=gone")}}]}]}).encode()
    hostport = url_server.url.removeprefix("http://")
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {hostport}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection(tuple(hostport.rsplit(":", 1)), timeout=10)
    sock.sendall(head + body)
    assert host.started.setdefault("gone", threading.Event()).wait(10), "the fetch never started"
    sock.close()
    closed = time.monotonic()
    while "gone" not in host.ended and time.monotonic() < closed + TIMEOUT:
        time.sleep(0.02)
    assert host.ended.get("gone", float("inf")) - closed < TIMEOUT / 2, "the fetch outlived its request"
    assert url_server.get("/health")[0] == 200


def test_flag_off_refuses_urls(server):
    """The session's server (no --allow-image-urls): a 400 naming the field and the flag, fetching nothing."""
    with pytest.raises(openai.BadRequestError) as err:
        chat(server, "https://example.com/cat.png")
    body = err.value.body
    assert body["param"] == FIELD and "--allow-image-urls" in body["message"], body
    mark = json.loads(server.get("/props")[1])["media_marker"]
    status, out = server.post("/completion", {"prompt": {"prompt_string": "x" + mark, "multimodal_data": [
        "http://example.com/a.png"]}, "n_predict": 1})
    assert status == 400 and out["error"]["param"] == "prompt.multimodal_data[0]"
    assert "--allow-image-urls" in out["error"]["message"]


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/cat.png", "http://localhost:{port}/cat.png", "http://2130706433:{port}/cat.png",
    "http://127.1:{port}/cat.png", "http://[::1]:{port}/cat.png", "http://[::ffff:127.0.0.1]:{port}/cat.png",
    "http://169.254.169.254/latest/meta-data", "http://10.0.0.1/a.png", "http://0.0.0.0:{port}/cat.png",
])
def test_private_hosts_refused(host, url):
    """Without --allow-private-image-urls: refused before any connection (by the address written
    out, in any form the socket layer reads, or by the addresses a name resolves to)."""
    url = url.format(port=host.port)
    config = ServerConfig(allow_image_urls=True, image_url_timeout=5.0)
    hits = host.hits.get("/cat.png", 0)
    with pytest.raises(BadRequest) as err:
        asyncio.run(fetch_images(config, [("f", ImageUrl(url))]))
    assert err.value.param == "f" and host.hits.get("/cat.png", 0) == hits
    assert "is a loopback, private, link-local or otherwise non-public address; vkrt serve " \
           "--allow-private-image-urls allows those" in err.value.message, err.value.message


def test_private_hosts_fetched_when_allowed(host):
    """With both flags the loopback host answers; the images fetch in place, data URLs left as they are."""
    config = ServerConfig(allow_image_urls=True, allow_private_image_urls=True)
    images = [("a", ImageUrl(host.url("/cat.png"))), ("b", b"inline"), ("c", ImageUrl(host.url("/hop")))]
    asyncio.run(fetch_images(config, images))
    assert images == [("a", PNG), ("b", b"inline"), ("c", PNG)]


@pytest.mark.parametrize("args, why", [
    (["--allow-private-image-urls"], "--allow-private-image-urls widens --allow-image-urls: give both"),
    (["--image-url-max-bytes", str((32 << 20) + 1)], "--image-url-max-bytes"),
    (["--image-url-max-bytes", "0"], "--image-url-max-bytes"),
    *[(["--image-url-timeout", value], "--image-url-timeout") for value in ("0", "-1", "nan", "inf")],
])
def test_serve_option_refusals(tmp_path, args, why):
    model = tmp_path / "none.gguf"
    model.write_bytes(b"")
    result = CliRunner().invoke(cli, ["serve", "-m", str(model), *args])
    assert result.exit_code == 2 and why in result.output and "Traceback" not in result.output, result.output
