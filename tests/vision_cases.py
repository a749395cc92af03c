"""The image prompts scripts/record_llama_vision.py records llama-server --mmproj's answers to
(tests/data/llama_vision_reference.json) and tests/test_vision_prompt.py replays: tiny text model,
tiny projector, deterministic images."""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image

from vkrt.model.mmproj_synthetic import MmprojSpec, write_mmproj

TEXT_MODEL = "tiny-qwen35"
MMPROJ = MmprojSpec(proj_dim=64, seed=21)
# (text before, image (height, width, seed), text after): sides multiples of 32; the first image's
# area is within the projector's limits (read as it is), the second's below its 8 tokens (scaled up
# to 96x128 by clip's bilinear resize and padded: image_input.resize_padded)
CASES = [("Look: ", (64, 128, 1), " what is it?"), ("<|im_start|>user\n", (96, 64, 2), "Describe.<|im_end|>\n")]
N_PREDICT = 8


def mmproj_file(folder) -> str:
    path = os.path.join(os.fspath(folder), "mmproj-tiny-qwen35.gguf")
    if not os.path.exists(path):
        write_mmproj(path, MMPROJ)
    return path


def image_png(h: int, w: int, seed: int) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()
