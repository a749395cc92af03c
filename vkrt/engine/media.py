"""Evaluating a prompt with images (a MediaPrompt): its text runs as token steps, each image's
rows as steps of input embeddings at the image's rotary positions (Engine.embed), as llama.cpp's
mtmd helper evaluates text and image chunks in turn. A projector whose images the text model
reads bidirectionally (Gemma 3: mtmd_decode_use_non_causal) has their rows attend each other both
ways, and an image is always read whole: a sequence that holds only part of one is cut back to
the image's start first (llama.cpp never keeps part of an image chunk)."""

from __future__ import annotations

import logging

import numpy as np

from ..errors import VkrtError
from ..model.media_prompt import MediaPrompt

log = logging.getLogger("vkrt")


def read_image(engine, prompt: MediaPrompt, seq_id: int, index: int) -> tuple[np.ndarray, int]:
    """Append the rows of the image holding token `index` of `prompt` from there to the image's
    end (or the prompt's) to `seq_id`, which holds the tokens before `index`; returns (the logits
    after the last row, how many rows from `index` on were read)."""
    hit = prompt.image_at(index)
    if hit is None:
        raise VkrtError(f"token {index} of the prompt is text, not an image's")
    vision = engine.vision
    if vision is None:
        raise VkrtError("the prompt holds an image but the engine has no vision projector (--mmproj)")
    start, img = hit
    first = index
    if vision.bidirectional and index > start:   # its rows see each other: the image is read again whole
        if not engine.can_truncate(seq_id, start) or engine.truncate(seq_id, start) != start:
            raise VkrtError(f"sequence {seq_id} holds part of an image whose rows attend each other, and cannot "
                            f"be cut back to the image's start (token {start})")
        first = start
    rope, after = img.positions(engine.cache.cells.text_position(seq_id, start), vision.mrope)
    end = min(start + img.n_tokens, len(prompt))   # a prompt may end inside an image
    a, b = first - start, end - start
    if vision.bidirectional and b - a > engine.n_ubatch:
        log.warning("an image of %d rows is read in micro-batches of %d: each row sees the later rows of its own "
                    "micro-batch only (as llama.cpp reads it); raise -ub to %d to read it whole", b - a,
                    engine.n_ubatch, b - a)
    logits = engine.embed(img.rows[a:b], rope[a:b], after[a:b], seq_id, causal=not vision.bidirectional,
                          ids=prompt.tokens[first:end])
    return logits, end - index


def eval_prompt(engine, prompt: MediaPrompt, seq_id: int = 0) -> np.ndarray:
    """Append the tokens of `prompt` past those `seq_id` holds (a prefix of it); returns the
    logits after the last ([vocab])."""
    index = engine.sequence_length(seq_id)
    if index >= len(prompt):
        raise VkrtError(f"sequence {seq_id} holds {index} tokens: the prompt of {len(prompt)} leaves none to read")
    logits = None
    while index < len(prompt):
        n = prompt.text_run(index)
        if n:
            logits = engine.eval(prompt.tokens[index:index + n], seq_id)
        else:
            logits, n = read_image(engine, prompt, seq_id, index)
        index += n
    return logits
