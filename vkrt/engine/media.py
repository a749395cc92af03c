"""Evaluating a prompt with images (a MediaPrompt): its text runs as token steps, each image's
rows as steps of input embeddings at the image's rotary positions (Engine.embed), as llama.cpp's
mtmd helper evaluates text and image chunks in turn."""

from __future__ import annotations

import numpy as np

from ..errors import VkrtError
from ..model.media_prompt import MediaPrompt


def read_image(engine, prompt: MediaPrompt, seq_id: int, index: int) -> tuple[np.ndarray, int]:
    """Append the rows of the image holding token `index` of `prompt` from there to the image's
    end (or the prompt's) to `seq_id`, which holds the tokens before `index`; returns (the logits
    after the last row, how many rows were read)."""
    hit = prompt.image_at(index)
    if hit is None:
        raise VkrtError(f"token {index} of the prompt is text, not an image's")
    if engine.vision is None:
        raise VkrtError("the prompt holds an image but the engine has no vision projector (--mmproj)")
    start, img = hit
    rope, after = img.positions(engine.cache.cells.text_position(seq_id, start), engine.vision.mrope)
    first = index - start
    n = min(img.n_tokens - first, len(prompt) - index)   # a prompt may end inside an image
    end = first + n
    return engine.embed(img.rows[first:end], rope[first:end], after[first:end], seq_id), n


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
