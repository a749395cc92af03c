"""A request's prompt with images: its text tokenised around the media markers in a request
thread, its images encoded on the scheduler thread (the GPU's owner, between steps), put
together as a MediaPrompt. Without a vision projector, or with a bad image, a 400 names the
request field that carried it. Images given by http(s) URL are fetched first (image_fetch.py)."""

from __future__ import annotations

import asyncio

from ..errors import ConfigError
from ..model.image_input import ImageError
from ..model.media_prompt import MediaPrompt, MediaPromptError, assemble, text_pieces
from .image_fetch import check_allowed, fetch_images
from .image_parts import MEDIA_MARKER
from .request_work import in_thread
from .scheduler import SchedulerClosed
from .validation import ApiError, BadRequest


def check_vision(state, images: list) -> None:
    """A 400 naming the first image's field when the server cannot take images (or one given by
    URL when it fetches none)."""
    if not images:
        return
    check_allowed(state.config, images)
    field = images[0][0]
    if state.engine.vision is None:
        raise BadRequest(f"'{field}': this server has no vision projector, so it takes no images (start vkrt serve "
                         f"with --mmproj FILE, or -hf with a repository holding an mmproj file)", field)


async def image_prompt(state, text: str, images: list, add_special: bool = True,
                       field: str = "messages") -> MediaPrompt:
    """The MediaPrompt of `text` (its media markers where `images`, (field, bytes) each, go); an
    image given by URL is fetched and its bytes put in its place in `images`."""
    check_vision(state, images)
    await fetch_images(state.config, images, state.version)
    vision = state.engine.vision
    try:
        pieces = await in_thread(text_pieces, state.request_tokenizer, text, len(images), MEDIA_MARKER,
                                 vision.frame, add_special)
    except MediaPromptError as exc:
        raise BadRequest(f"{exc} (a template that drops a message drops its images' markers too)", field) from None
    tok = state.tokenizer
    first = pieces[0]
    if len(first) >= 2 and first[0] == first[1] == tok.bos_id and tok.add_bos:   # the template wrote BOS too
        pieces[0] = first[1:]

    def encode(engine):
        return [vision.image(data, name) for name, data in images]
    try:
        chunks = await asyncio.wrap_future(state.scheduler.call(encode))
    except SchedulerClosed as exc:
        raise ApiError(str(exc), status=503, type="unavailable_error") from None
    except ImageError as exc:
        name = next((f for f, _ in images if str(exc).startswith(f)), images[0][0])
        raise BadRequest(str(exc), name) from None
    except ConfigError as exc:
        raise BadRequest(str(exc), images[0][0]) from None
    return assemble(pieces, chunks)
