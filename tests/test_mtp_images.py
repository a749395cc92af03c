"""MTP drafting over image prompts (engine/mtp_drafter.py): the head's entries of an image's
positions read the image's rows in place of token embeddings at the trunk's rotary positions.
A step of input embeddings through the head (MtpHead.token_rows' rows, explicit positions) gives
the logits its token step does; over an image prompt every head entry holds the trunk cell's
M-RoPE position and `after`, the entries before the image's rows read them (and the one at its
last row the next token's embedding), and entries made while the prompt streams in (a long
prompt's flush) draft what entries made at the first draft do. A text prompt longer than the
flush point generates as without drafts (it once failed there)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models import TINY
from vision_cases import CASES, TEXT_MODEL, image_png, mmproj_file
from vkrt.engine.drafting import open_drafting
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.media import eval_prompt
from vkrt.engine.mtp_head import MtpHead
from vkrt.engine.sampler import GREEDY
from vkrt.engine.speculative import SpecOptions
from vkrt.model.loader import Model
from vkrt.model.media_prompt import MARKER
from vkrt.model.synthetic import write_model
from vkrt.model.vision import Vision

TOKENS = [5, 17, 99, 3, 250, 42, 42, 7, 130, 64, 11, 200]
OPTS = SpecOptions("mtp", draft_max=4, p_min=0.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp-images")
    return str(write_model(d / "mtp.gguf", dataclasses.replace(TINY[TEXT_MODEL], n_nextn=1))), mmproj_file(d)


def test_embedding_rows_read_as_the_tokens(device, files):
    """The head's entries as input embeddings (the tokens' own rows, text positions) give its
    token step's logits; other rows give others."""
    path, _ = files
    n = len(TOKENS) - 1
    states = np.random.default_rng(3).standard_normal((n, TINY[TEXT_MODEL].n_embd)).astype(np.float32)
    pos = np.arange(n, dtype=np.int32)
    with Model(device, path, progress=False) as m, MtpHead(m, 16) as head, \
            Engine(head, n_ctx=64, n_ubatch=16, pad_prompts=False, embd_input=True) as e:
        head.write_hidden(states)
        by_id = e.eval(TOKENS[1:])
        e.reset(0)
        rows = head.token_rows(TOKENS[1:])
        head.write_hidden(states)
        by_row = e.embed(rows, np.repeat(pos[:, None], 3, axis=1), pos + 1)
        e.reset(0)
        head.write_hidden(states)
        other = e.embed(np.roll(rows, 1, axis=0), np.repeat(pos[:, None], 3, axis=1), pos + 1)
    np.testing.assert_allclose(by_row, by_id, rtol=0, atol=1e-4 * float(np.abs(by_id).max()))
    assert np.abs(other - by_id).max() > 0.01 * float(np.abs(by_id).max())


def _draft_after_image(device, files, flush_at: int | None):
    """For each image prompt: the drafts after its first token, the head's and the trunk's
    rotary positions (rope, after) of the positions the head holds, and the input embeddings
    the head's steps read, by position, against the image's rows and the embedding of the
    token after the image."""
    path, mmproj = files
    out = []
    with Model(device, path, progress=False) as m:
        vision = Vision(device, mmproj, m.cfg, path)
        with Engine(m, n_ctx=256, n_ubatch=16, vision=vision) as e, open_drafting(OPTS, m, e, device) as d:
            drafter, read, embed = d.drafter(0), {}, d.engine.embed

            def spy(rows, rope, after, seq_id=0, **kw):
                start = d.engine.sequence_length(seq_id)
                read.update({start + k: np.array(r) for k, r in enumerate(rows)})
                return embed(rows, rope, after, seq_id, **kw)
            d.engine.embed = spy
            if flush_at is not None:
                drafter.flush_at = flush_at
            for before, (h, w, seed), after in CASES:
                e.reset(0)
                read.clear()
                prompt = vision.prompt(m.tokenizer, before + MARKER + after, [image_png(h, w, seed)], MARKER)
                (s, img), = prompt.images
                first = int(np.argmax(eval_prompt(e, prompt)))
                drafts = drafter.draft(prompt.tokens + [first], 4)
                n = len(prompt)
                assert d.engine.sequence_length(0) == n
                hc, tc = d.engine.cache.cells, e.cache.cells
                held, trunk = hc.cells_of(0, n), tc.cells_of(0, n)
                inputs = np.stack([read[p] for p in range(s - 1, s + img.n_tokens)])
                want = np.concatenate([img.rows, d.model.token_rows([prompt.tokens[s + img.n_tokens]])])
                out.append((drafts, (hc.rope[held], hc.after[held]), (tc.rope[trunk], tc.after[trunk]), inputs, want))
    return out


def test_head_entries_read_the_image_at_the_trunks_positions(device, files):
    streamed = _draft_after_image(device, files, flush_at=8)   # entries made while the prompt streams in
    at_draft = _draft_after_image(device, files, flush_at=None)
    for (d1, head, trunk, inputs, want), (d2, *_) in zip(streamed, at_draft):
        for a, b in zip(head, trunk):
            np.testing.assert_array_equal(a, b)
        assert (trunk[0][:, 1] != trunk[0][:, 0]).any()   # the image's grid: M-RoPE moved some positions
        np.testing.assert_array_equal(inputs, want)
        assert len(d1) == 4 and d1 == d2


def test_long_text_prompt_streams_its_entries(device, files):
    path, _ = files
    prompt = list(range(5, 40)) * 3   # 105 tokens: past the flush point (2 head micro-batches of 16)
    with Model(device, path, progress=False) as m:
        with Engine(m, n_ctx=256, n_ubatch=16) as e:
            base = generate(e, prompt, 12, GREEDY)
        with Engine(m, n_ctx=256, n_ubatch=16) as e, open_drafting(OPTS, m, e, device) as d:
            gen = generate(e, prompt, 12, GREEDY, speculation=d.speculation(0))
    assert gen.tokens == base.tokens and gen.timings.draft_n > 0
