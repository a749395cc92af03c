"""Images given by http(s) URL (image_parts.ImageUrl), fetched only with vkrt serve
--allow-image-urls: on the event loop with aiohttp's client, a request's images all at once (a
client that goes away cancels them), each within --image-url-timeout seconds and
--image-url-max-bytes bytes (Content-Length first, then the bytes counted as they come), at most
MAX_REDIRECTS redirects, http and https only, and only an answer whose Content-Type is an image
type. Hosts that resolve to loopback, private, link-local or other non-public addresses are
refused unless --allow-private-image-urls: a request must not reach the server's own network
through it (the addresses checked are the ones connected to). A failure is a 400 naming the field
and why; the bytes then take a data URL's path (image_prompt.py)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver
from yarl import URL

from .image_parts import IMAGE_TYPES, ImageUrl
from .validation import BadRequest

MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 64 << 10
_PRIVATE = "a loopback, private, link-local or otherwise non-public address"


class _Refused(Exception):
    """A fetch given up; the message says why."""


def check_allowed(config, images: list) -> None:
    """A 400 naming the first image given by URL when the server fetches none."""
    if config.allow_image_urls:
        return
    for field, source in images:
        if isinstance(source, ImageUrl):
            raise BadRequest(f"'{field}': this server does not fetch image URLs (start vkrt serve with "
                             f"--allow-image-urls to let it); send the image inline as a data URL "
                             f"(data:image/png;base64,...)", field)


async def fetch_images(config, images: list, version: str = "") -> None:
    """Each (field, ImageUrl) of `images` replaced, in place, by (field, bytes), fetched at once;
    the first failure is a 400 naming its field (the other fetches are cancelled)."""
    todo = [k for k, (_, source) in enumerate(images) if isinstance(source, ImageUrl)]
    if not todo:
        return
    check_allowed(config, images)
    resolver = None if config.allow_private_image_urls else _PublicResolver()
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False)
    headers = {"User-Agent": f"vkrt/{version}" if version else "vkrt", "Accept": ", ".join(IMAGE_TYPES)}
    async with aiohttp.ClientSession(connector=connector, headers=headers, cookie_jar=aiohttp.DummyCookieJar(),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(_fetch(session, config, *images[k])) for k in todo]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
    for k, task in zip(todo, tasks):
        images[k] = (images[k][0], task.result())


async def _fetch(session, config, field: str, source: ImageUrl) -> bytes:
    try:
        async with asyncio.timeout(config.image_url_timeout):
            return await _get(session, URL(source.url), config)
    except TimeoutError:
        why = f"no whole answer within {config.image_url_timeout:g} s (--image-url-timeout)"
    except _Refused as exc:
        why = str(exc)
    except ValueError as exc:   # yarl's parse of the URL or of a redirect's Location
        why = f"not a valid URL ({exc})"
    except aiohttp.ClientError as exc:
        why = _client_error(exc)
    shown = source.url if len(source.url) <= 100 else source.url[:100] + "..."
    raise BadRequest(f"'{field}': the image at {shown} could not be fetched: {why}", field)


async def _get(session, url: URL, config) -> bytes:
    """The body of `url`, following redirects, each hop's URL checked."""
    for _ in range(MAX_REDIRECTS + 1):
        _check_url(url, config.allow_private_image_urls)
        async with session.get(url, allow_redirects=False) as resp:
            location = resp.headers.get("Location")
            if resp.status in _REDIRECTS and location:
                url = url.join(URL(location))
                continue
            return await _body(resp, config.image_url_max_bytes)
    raise _Refused(f"more than {MAX_REDIRECTS} redirects")


async def _body(resp, limit: int) -> bytes:
    if not 200 <= resp.status < 300:
        raise _Refused(f"the answer was HTTP {resp.status} {resp.reason or ''}".rstrip())
    if resp.content_type not in IMAGE_TYPES:
        raise _Refused(f"the answer is not an image: its Content-Type is {resp.content_type!r} (images are "
                       f"{', '.join(IMAGE_TYPES)})")
    too_large = f"the image is larger than {limit} bytes (--image-url-max-bytes)"
    if resp.content_length is not None and resp.content_length > limit:
        raise _Refused(f"{too_large}: its Content-Length says {resp.content_length}")
    data = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        data += chunk
        if len(data) > limit:
            raise _Refused(too_large)
    return bytes(data)


def _check_url(url: URL, allow_private: bool) -> None:
    if url.scheme not in ("http", "https"):
        raise _Refused(f"{url.scheme or 'a relative'} URL: only http and https URLs are fetched")
    host = url.raw_host
    if not host:
        raise _Refused("the URL names no host")
    if allow_private:
        return
    try:   # an address written out (any form the socket layer reads as one); a name is checked as resolved
        found = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        return
    for *_, addr in found:
        _check_address(addr[0], host)


def _check_address(address: str, host: str) -> None:
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not ip.is_global or ip.is_multicast:
        shown = host if host == address else f"{host}, at {address},"
        raise _Refused(f"{shown} is {_PRIVATE}; vkrt serve --allow-private-image-urls allows those")


class _PublicResolver(AbstractResolver):
    """The system's resolver, refusing a name that resolves to any non-public address."""

    def __init__(self):
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET):
        found = await self._inner.resolve(host, port, family)
        for entry in found:
            _check_address(entry["host"].split("%", 1)[0], host)
        return found

    async def close(self) -> None:
        await self._inner.close()


def _client_error(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"its host {exc.host!r} could not be resolved"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"could not connect to {exc.host}:{exc.port} ({exc.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the answer's body was cut short or malformed"
    return str(exc) or type(exc).__name__
