"""Perplexity as llama-perplexity computes it: chunks, half-context scoring and BOS replacement,
against a numpy computation from the engine's own logits."""

import math

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine.perplexity import NllSums, PerplexityError, chunk_count, chunk_scores
from vkrt.model.loader import Model

TEXT = ("The quick brown fox jumps over the lazy dog. Once upon a time there was a small model that learned "
        "to count: one, two, three, four. Hello, world! The capital of France is Paris. ") * 12


@pytest.fixture(scope="module")
def tiny(device, tmp_path_factory):
    model = Model(device, tiny_model("tiny-llama", tmp_path_factory.mktemp("ppl")))
    engine = Engine(model, n_ctx=64, n_batch=24, n_ubatch=24)
    yield model, engine
    engine.close()
    model.close()


def numpy_ppl(engine: Engine, tokens: list[int], n_ctx: int, n_chunk: int, bos: int | None) -> float:
    """Each chunk evaluated whole in one call, its first token replaced by bos, the log-softmax
    of rows n_ctx // 2 .. n_ctx - 2 in float64 scored against the next token."""
    nll = []
    for i in range(n_chunk):
        chunk = np.array(tokens[i * n_ctx:(i + 1) * n_ctx], np.int32)
        if bos is not None:
            chunk[0] = bos
        engine.reset()
        logits = engine.eval(chunk, all_logits=True).astype(np.float64)
        rows = logits[n_ctx // 2:n_ctx - 1]
        log_probs = rows - rows.max(axis=1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(axis=1, keepdims=True))
        targets = np.array(tokens[i * n_ctx + n_ctx // 2 + 1:(i + 1) * n_ctx])
        nll.extend(-log_probs[np.arange(targets.size), targets])
    assert len(nll) == n_chunk * (n_ctx - 1 - n_ctx // 2)
    return math.exp(np.mean(nll))


def vkrt_ppl(engine, tokens, n_ctx, n_batch, n_chunk, bos) -> NllSums:
    from vkrt.engine.perplexity import row_nll
    sums = NllSums()
    for _, logits, targets in chunk_scores(engine, np.array(tokens), n_ctx, n_batch, n_chunk, bos):
        sums.add(row_nll(logits, targets))
    return sums


@pytest.mark.parametrize("n_batch", [24, 64])   # batches straddling the scored half, and one batch a chunk
def test_ppl_equals_numpy_from_engine_logits(tiny, n_batch):
    model, engine = tiny
    tokens = model.tokenizer.encode(TEXT)
    n_ctx = 64
    n_chunk = chunk_count(len(tokens), n_ctx, 3)
    assert n_chunk == 3
    bos = model.tokenizer.bos_id
    sums = vkrt_ppl(engine, tokens, n_ctx, n_batch, n_chunk, bos)
    assert sums.count == 3 * 31
    assert sums.ppl == pytest.approx(numpy_ppl(engine, tokens, n_ctx, n_chunk, bos), rel=1e-4)


def test_bos_replacement_changes_the_chunks(tiny):
    model, engine = tiny
    tokens = model.tokenizer.encode(TEXT)
    bos = model.tokenizer.bos_id
    assert tokens[64] != bos and tokens[128] != bos
    with_bos = vkrt_ppl(engine, tokens, 64, 64, 3, bos).ppl
    without = vkrt_ppl(engine, tokens, 64, 64, 3, None).ppl
    assert without == pytest.approx(numpy_ppl(engine, tokens, 64, 3, None), rel=1e-4)
    assert abs(with_bos - without) > 1e-3 * without


def test_chunk_count_is_llama_perplexitys():
    assert chunk_count(1000, 128) == 7
    assert chunk_count(1000, 128, 3) == 3
    assert chunk_count(1000, 128, 50) == 7
    with pytest.raises(PerplexityError, match="you need at least 256 tokens .* context of 128.* only 255 tokens"):
        chunk_count(255, 128)
    with pytest.raises(PerplexityError, match="--chunks 0"):
        chunk_count(1000, 128, 0)


def test_final_error_is_llama_perplexitys_formula():
    sums = NllSums()
    values = np.array([1.0, 2.0, 4.0, 3.0])
    sums.add(values)
    mean = values.mean()
    var = (values * values).mean() - mean * mean
    assert sums.ppl == pytest.approx(math.exp(mean))
    assert sums.ppl_error == pytest.approx(math.sqrt(var / 3) * math.exp(mean))
