"""The image prompts scripts/record_llama_vision.py records llama-server --mmproj's answers to
(tests/data/llama_vision_reference.json, tests/data/llama_vision_reference_gemma3.json) and
tests/test_vision_prompt.py / tests/test_vision_gemma3_prompt.py replay: tiny text models, tiny
projectors, deterministic images."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vkrt.model.mmproj_synthetic import MmprojSpec, write_mmproj
from vkrt.model.vision_config import GEMMA3

TEXT_MODEL = "tiny-qwen35"
MMPROJ = MmprojSpec(proj_dim=64, seed=21)
# (text before, image (height, width, seed), text after): sides multiples of 32; the first image's
# area is within the projector's limits (read as it is), the second's below its 8 tokens (scaled up
# to 96x128 by clip's bilinear resize and padded: image_input.resize_padded)
CASES = [("Look: ", (64, 128, 1), " what is it?"), ("<|im_start|>user\n", (96, 64, 2), "Describe.<|im_end|>\n")]
N_PREDICT = 8

# Gemma 3: a 128 x 128 tower of 8-pixel patches pooled 4 x 4 (the default: no scale_factor key),
# 16 image tokens, more than tiny-gemma3's sliding window of 8; mean and std differ by channel.
# The images: the projector's size (read as it is), wide and smaller (scaled up, padded above and
# below), tall and larger (scaled down, padded left and right)
GEMMA3_TEXT_MODEL = "tiny-gemma3"
GEMMA3_MMPROJ = MmprojSpec(projector=GEMMA3, proj_dim=64, patch_size=8, n_merge=4, n_pos_side=16,
                           mean=(0.48, 0.46, 0.41), std=(0.27, 0.26, 0.28), seed=22)
GEMMA3_CASES = [("Look: ", (128, 128, 3), " what is it?"),
                ("<start_of_turn>user\n", (72, 160, 4), "Describe.<end_of_turn>\n<start_of_turn>model\n"),
                ("An image ", (300, 190, 5), " and more text after it.")]


@dataclass(frozen=True)
class VisionSet:
    """A text model, its projector and the prompts recorded against llama-server for them."""

    text_model: str
    mmproj: MmprojSpec
    file: str            # the projector's file name
    cases: list
    n_predict: int
    reference: str       # tests/data/<reference>


SETS = {"qwen35": VisionSet(TEXT_MODEL, MMPROJ, "mmproj-tiny-qwen35.gguf", CASES, N_PREDICT,
                            "llama_vision_reference.json"),
        "gemma3": VisionSet(GEMMA3_TEXT_MODEL, GEMMA3_MMPROJ, "mmproj-tiny-gemma3.gguf", GEMMA3_CASES, N_PREDICT,
                            "llama_vision_reference_gemma3.json")}


def set_mmproj_file(vs: VisionSet, folder) -> str:
    path = os.path.join(os.fspath(folder), vs.file)
    if not os.path.exists(path):
        write_mmproj(path, vs.mmproj)
    return path


def mmproj_file(folder) -> str:
    return set_mmproj_file(SETS["qwen35"], folder)


def gemma3_mmproj_file(folder) -> str:
    return set_mmproj_file(SETS["gemma3"], folder)


def image_rgb(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def image_png(h: int, w: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image_rgb(h, w, seed)).save(buf, format="PNG")
    return buf.getvalue()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def case_prompt(vision, model, case, marker: str):
    """The MediaPrompt of a case (text before, (h, w, seed) of its image, text after)."""
    before, (h, w, seed), after = case
    return vision.prompt(model.tokenizer, before + marker + after, [image_png(h, w, seed)], marker)


def follow_reference(engine, logits: np.ndarray, ref: dict, name: str) -> float:
    """Teacher-force llama.cpp's recorded greedy tokens from a prompt's last `logits`: each must be
    vkrt's most likely too; the largest gap between the two sides' log-probabilities of the
    recorded top tokens."""
    worst = 0.0
    for i, (tok, tops) in enumerate(zip(ref["tokens"], ref["top_logprobs"])):
        lp = log_softmax(logits)
        ids = [t for t, _ in tops]
        worst = max(worst, float(np.abs(lp[ids] - np.array([v for _, v in tops])).max()))
        assert int(np.argmax(lp)) == tok, (name, i)
        logits = engine.eval([tok])
    return worst
