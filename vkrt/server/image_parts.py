"""Images in requests, as llama-server takes them: OpenAI `image_url` content parts holding a
data URL (base64; http(s) URLs are refused: the server fetches nothing), and /completion's
`{"prompt_string": ..., "multimodal_data": [base64, ...]}` prompts whose text carries the
server's media marker where each image goes, the Responses API's `input_image` parts and the
Anthropic Messages API's base64 `image` blocks. Each image becomes (field, bytes) on the request;
in the text its place is the media marker (MEDIA_MARKER: random per process, as llama-server's;
/props reports it)."""

from __future__ import annotations

import base64
import binascii
import re
import secrets

from .validation import BadRequest

MEDIA_MARKER = f"<__media_{secrets.token_hex(8)}__>"
IMAGE_PARTS = ("image_url", "input_image")
MAX_IMAGES = 64                # images a request may carry
MAX_IMAGE_BYTES = 32 << 20     # one decoded image (the body limit, --body-limit, usually binds first)
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)", re.S)
IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp")
ANTHROPIC_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")   # what Anthropic's API takes
DETAILS = ("auto", "low", "high")


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


def data_url_bytes(url, field: str) -> bytes:
    """The image in a data URL (data:image/png;base64,...); a 400 for anything else, naming `field`."""
    if not isinstance(url, str) or not url:
        raise BadRequest(f"'{field}' must be a data URL string (data:image/png;base64,...)", field)
    low = url[:16].lower()
    if low.startswith(("http://", "https://")):
        raise BadRequest(f"'{field}': this server does not fetch image URLs; send the image inline as a data URL "
                         f"(data:image/png;base64,...)", field)
    m = _DATA_URL.fullmatch(url)
    if m is None:
        raise BadRequest(f"'{field}' must be a base64 data URL (data:image/png;base64,...); got "
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
    images.append((field, data_url_bytes(url, field)))
    return MEDIA_MARKER


def source_image(block: dict, at: str, images: list) -> str:
    """An Anthropic `image` block ({"source": {"type": "base64", "media_type", "data"}}): its image
    appended to `images` as (field, bytes); returns the media marker. url and file sources are refused."""
    _room(images, at)
    source = block.get("source")
    if not isinstance(source, dict):
        raise BadRequest(f"'{at}.source' must be an object {{'type': 'base64', 'media_type', 'data'}}",
                         f"{at}.source")
    kind = source.get("type")
    if kind != "base64":
        why = {"url": "this server does not fetch image URLs", "file": "vkrt keeps no uploaded files"}.get(
            kind, f"got {kind!r}")
        raise BadRequest(f"'{at}.source.type' must be 'base64' ({why}; send the image inline as base64 data)",
                         f"{at}.source.type")
    media = source.get("media_type")
    if media not in ANTHROPIC_TYPES:
        raise BadRequest(f"'{at}.source.media_type' must be one of {', '.join(ANTHROPIC_TYPES)}, got {media!r}",
                         f"{at}.source.media_type")
    images.append((f"{at}.source.data", decode_base64(source.get("data"), f"{at}.source.data")))
    return MEDIA_MARKER


def multimodal_prompt(prompt: dict, images: list) -> str:
    """llama-server's /completion prompt object: its `prompt_string`, each `multimodal_data`
    item (base64) appended to `images`; the text must hold one media marker an image."""
    if "prompt_string" not in prompt:
        raise BadRequest("'prompt' must be a string or an array of token ids (or llama-server's object "
                         "{\"prompt_string\": ..., \"multimodal_data\": [...]})", "prompt")
    text = prompt["prompt_string"]
    if not isinstance(text, str):
        raise BadRequest("'prompt.prompt_string' must be a string", "prompt.prompt_string")
    data = prompt.get("multimodal_data", [])
    if not isinstance(data, list):
        raise BadRequest("'prompt.multimodal_data' must be an array of base64 strings", "prompt.multimodal_data")
    if len(data) > MAX_IMAGES:
        raise BadRequest(f"'prompt.multimodal_data' holds {len(data)} items; at most {MAX_IMAGES}",
                         "prompt.multimodal_data")
    for k, item in enumerate(data):
        field = f"prompt.multimodal_data[{k}]"
        images.append((field, decode_base64(item, field)))
    markers = text.count(MEDIA_MARKER)
    if markers != len(data):
        raise BadRequest(f"'prompt.prompt_string' holds {markers} media marker(s) for {len(data)} image(s) in "
                         f"'prompt.multimodal_data': put the marker /props reports (media_marker) where each "
                         f"image goes", "prompt.prompt_string")
    return text
