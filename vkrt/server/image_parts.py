"""Images in requests, as llama-server takes them: OpenAI `image_url` content parts holding a
data URL (base64) or an http(s) URL, and /completion's `{"prompt_string": ..., "multimodal_data":
[base64, ...]}` prompts whose text carries the server's media marker where each image goes, the
Responses API's `input_image` parts and the Anthropic Messages API's `image` blocks (base64 or url
sources). Each image becomes (field, bytes) on the request, or (field, ImageUrl) for an http(s)
URL, fetched later on the event loop (image_fetch.py: only with vkrt serve --allow-image-urls); in
the text its place is the media marker (MEDIA_MARKER: random per process, as llama-server's; /props
reports it)."""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass

from .validation import BadRequest

MEDIA_MARKER = f"<__media_{secrets.token_hex(8)}__>"
IMAGE_PARTS = ("image_url", "input_image")
MAX_IMAGES = 64                # images a request may carry
MAX_IMAGE_BYTES = 32 << 20     # one decoded image (the body limit, --body-limit, usually binds first)
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)", re.S)
IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp")
ANTHROPIC_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")   # what Anthropic's API takes
DETAILS = ("auto", "low", "high")
URL_SCHEMES = ("http://", "https://")


@dataclass(frozen=True)
class ImageUrl:
    """An image a request gives by http(s) URL: fetched before its prompt is put together."""

    url: str


def is_http_url(text) -> bool:
    return isinstance(text, str) and text[:8].lower().startswith(URL_SCHEMES)


def decode_base64(text, field: str) -> bytes:
    """The bytes of base64 `text` (whitespace allowed), or a 400 naming `field`."""
    if not isinstance(text, str) or not text:
        raise BadRequest(f"'{field}' must be a non-empty base64 string", field)
    if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise BadRequest(f"'{field}' holds more than the {MAX_IMAGE_BYTES} bytes an image may have", field)
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"'{field}' is not valid base64", field) from None


def image_source(url, field: str) -> bytes | ImageUrl:
    """The image of a data URL (data:image/png;base64,...), or an ImageUrl for an http(s) URL; a
    400 for anything else, naming `field`."""
    if not isinstance(url, str) or not url:
        raise BadRequest(f"'{field}' must be a data URL (data:image/png;base64,...) or an http(s) URL string", field)
    if is_http_url(url):
        return ImageUrl(url)
    m = _DATA_URL.fullmatch(url)
    if m is None:
        raise BadRequest(f"'{field}' must be a base64 data URL (data:image/png;base64,...) or an http(s) URL; got "
                         f"{url[:32]!r}{'...' if len(url) > 32 else ''}", field)
    kind = (m.group("type") or "").lower()
    if kind and kind not in IMAGE_TYPES:
        raise BadRequest(f"'{field}' holds {kind!r}; images are {', '.join(IMAGE_TYPES)}", field)
    return decode_base64(m.group("data"), field)


def _room(images: list, at: str) -> None:
    if len(images) >= MAX_IMAGES:
        raise BadRequest(f"'{at}': a request may carry at most {MAX_IMAGES} images", at)


def _detail(value, field: str) -> None:
    """`detail`: "auto", "low" or "high" are taken; none changes how the image is sized (docs/images.md)."""
    if value is not None and value not in DETAILS:
        raise BadRequest(f"'{field}' must be one of {', '.join(DETAILS)} (none changes the image's resolution), "
                         f"got {value!r}", field)


def image_part(part: dict, at: str, images: list) -> str:
    """An `image_url` (chat) or `input_image` (Responses) part: its image appended to `images` as
    (field, bytes); returns the text that stands for it (the media marker)."""
    _room(images, at)
    if part.get("type") == "input_image":
        if part.get("file_id") is not None:
            raise BadRequest(f"'{at}.file_id': vkrt keeps no uploaded files; send the image inline as a data URL "
                             f"in 'image_url' (data:image/png;base64,...)", f"{at}.file_id")
        url, field = part.get("image_url"), f"{at}.image_url"
        _detail(part.get("detail"), f"{at}.detail")
    else:
        value = part.get("image_url")
        url, field = (value.get("url"), f"{at}.image_url.url") if isinstance(value, dict) else \
            (value, f"{at}.image_url")
        if isinstance(value, dict):
            _detail(value.get("detail"), f"{at}.image_url.detail")
    images.append((field, image_source(url, field)))
    return MEDIA_MARKER


def source_image(block: dict, at: str, images: list) -> str:
    """An Anthropic `image` block ({"source": {"type": "base64", "media_type", "data"}}, or
    {"source": {"type": "url", "url"}}): its image appended to `images` as (field, bytes) or
    (field, ImageUrl); returns the media marker. file sources are refused."""
    _room(images, at)
    source = block.get("source")
    if not isinstance(source, dict):
        raise BadRequest(f"'{at}.source' must be an object {{'type': 'base64', 'media_type', 'data'}} or "
                         f"{{'type': 'url', 'url'}}", f"{at}.source")
    kind = source.get("type")
    if kind == "url":
        url = source.get("url")
        if not is_http_url(url):
            raise BadRequest(f"'{at}.source.url' must be an http(s) URL string", f"{at}.source.url")
        images.append((f"{at}.source.url", ImageUrl(url)))
        return MEDIA_MARKER
    if kind != "base64":
        why = "vkrt keeps no uploaded files" if kind == "file" else f"got {kind!r}"
        raise BadRequest(f"'{at}.source.type' must be 'base64' or 'url' ({why}; send the image inline as base64 "
                         f"data)", f"{at}.source.type")
    media = source.get("media_type")
    if media not in ANTHROPIC_TYPES:
        raise BadRequest(f"'{at}.source.media_type' must be one of {', '.join(ANTHROPIC_TYPES)}, got {media!r}",
                         f"{at}.source.media_type")
    images.append((f"{at}.source.data", decode_base64(source.get("data"), f"{at}.source.data")))
    return MEDIA_MARKER


def multimodal_prompt(prompt: dict, images: list) -> str:
    """llama-server's /completion prompt object: its `prompt_string`, each `multimodal_data`
    item (base64, or an http(s) URL) appended to `images`; the text must hold one media marker an image."""
    if "prompt_string" not in prompt:
        raise BadRequest("'prompt' must be a string or an array of token ids (or llama-server's object "
                         "{\"prompt_string\": ..., \"multimodal_data\": [...]})", "prompt")
    text = prompt["prompt_string"]
    if not isinstance(text, str):
        raise BadRequest("'prompt.prompt_string' must be a string", "prompt.prompt_string")
    data = prompt.get("multimodal_data", [])
    if not isinstance(data, list):
        raise BadRequest("'prompt.multimodal_data' must be an array of base64 strings (or http(s) URLs)",
                         "prompt.multimodal_data")
    if len(data) > MAX_IMAGES:
        raise BadRequest(f"'prompt.multimodal_data' holds {len(data)} items; at most {MAX_IMAGES}",
                         "prompt.multimodal_data")
    for k, item in enumerate(data):
        field = f"prompt.multimodal_data[{k}]"
        images.append((field, ImageUrl(item) if is_http_url(item) else decode_base64(item, field)))
    markers = text.count(MEDIA_MARKER)
    if markers != len(data):
        raise BadRequest(f"'prompt.prompt_string' holds {markers} media marker(s) for {len(data)} image(s) in "
                         f"'prompt.multimodal_data': put the marker /props reports (media_marker) where each "
                         f"image goes", "prompt.prompt_string")
    return text
