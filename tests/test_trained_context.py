"""A context past the model's trained one (its {arch}.context_length) opens with a warning that
names both, as llama.cpp's does; within it, none."""

from __future__ import annotations

import logging

import pytest

from models import tiny_model
from vkrt.engine.options import EngineOptions, open_engine


@pytest.mark.parametrize("n_ctx,n_seq,warned", [(1024, 1, True), (512, 1, False), (1024, 2, False)])
def test_warned_past_the_trained_context(device, tmp_path, caplog, n_ctx, n_seq, warned):
    path = tiny_model("tiny-llama", tmp_path)   # trained context: 512
    with caplog.at_level(logging.WARNING, logger="vkrt"):
        model, engine = open_engine(device, str(path), EngineOptions(n_ctx=n_ctx, n_seq_max=n_seq, n_ubatch=32,
                                                                     progress=False))
        engine.close()
        model.close()
    assert model.cfg.n_ctx_train == 512
    said = [r.getMessage() for r in caplog.records if "trained context" in r.getMessage()]
    assert bool(said) == warned
    if warned:
        assert f"{n_ctx} cells a sequence" in said[0] and "of 512 tokens (llama.context_length)" in said[0]
