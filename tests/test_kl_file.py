"""llama-perplexity's logits file: the uint16 log-softmax encoding against a row-by-row
re-implementation of llama.cpp's writer (log_softmax in tools/perplexity/perplexity.cpp), the
layout, and refusals of files that do not fit."""

import math
import struct

import numpy as np
import pytest

from vkrt.engine.kl_divergence import KLStats
from vkrt.engine.kl_file import (LogitsFileError, LogitsReader, LogitsWriter, decode_rows, encode_rows, row_words,
                                 scored_rows)

F = np.float32


def llama_row(logits: np.ndarray) -> tuple[float, float, list[int]]:
    """llama.cpp's writer for one row, scalar by scalar in float32 (sum of expf in double)."""
    max_logit = min_logit = F(logits[0])
    for v in logits[1:]:
        max_logit, min_logit = max(max_logit, F(v)), min(min_logit, F(v))
    min_logit = max(min_logit, F(max_logit - F(16)))
    sum_exp = sum(float(F(math.exp(float(F(v - max_logit))))) for v in logits)
    log_sum_exp = F(math.log(sum_exp))
    min_log_prob = F(F(min_logit - max_logit) - log_sum_exp)
    scale = F(F(max_logit - min_logit) / F(65535))
    if not scale:
        return scale, min_log_prob, [0] * logits.size
    inv = F(F(1) / scale)
    codes = []
    for v in logits:
        x = F(inv * F(F(v) - min_logit))
        codes.append(int(np.rint(x)) & 0xFFFF if F(v) > min_logit else 0)
    return scale, min_log_prob, codes


def test_encoding_matches_llama_cpp_writer():
    rng = np.random.default_rng(0)
    n_vocab = 301   # odd: each row is padded with one word
    rows = [rng.normal(0, 4, n_vocab), rng.normal(0, 0.5, n_vocab),   # spread over and under 16 nats
            np.full(n_vocab, 1.5), np.linspace(-40, 10, n_vocab)]       # flat: scale 0
    logits = np.array(rows, np.float32)
    enc = encode_rows(logits)
    assert enc.shape == (4, row_words(n_vocab)) and row_words(n_vocab) == 2 * 151 + 4
    assert (enc[:, -1] == 0).all()   # the padding word
    for row, got in zip(logits, enc):
        scale, min_log_prob, codes = llama_row(row)
        head = got[:4].view(np.float32)
        assert head[0] == pytest.approx(scale, rel=1e-6)
        assert head[1] == pytest.approx(min_log_prob, rel=1e-6, abs=1e-6)
        diff = np.abs(got[4:4 + n_vocab].astype(int) - np.array(codes))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99   # ties may round apart on a last-bit difference
    # decoded: the log-softmax to half a step, for tokens within 16 nats of the best
    lsm = logits - logits.max(1, keepdims=True)
    lsm -= np.log(np.exp(lsm.astype(np.float64)).sum(1, keepdims=True)).astype(np.float32)
    dec = decode_rows(enc, n_vocab)
    step = enc[:, :4].view(np.float32)[:, :1]
    near = lsm > lsm.max(1, keepdims=True) - 16
    assert (np.abs(dec - lsm)[near] <= (step * 0.51 + 1e-5).repeat(n_vocab, 1)[near]).all()


def test_file_layout_is_llama_cpps(tmp_path):
    path = tmp_path / "base.kl"
    n_ctx, n_vocab, n_chunk = 10, 7, 2
    tokens = np.arange(25, dtype=np.int32) % n_vocab
    rng = np.random.default_rng(1)
    chunks = [rng.normal(0, 3, (scored_rows(n_ctx), n_vocab)).astype(np.float32) for _ in range(n_chunk)]
    with LogitsWriter(str(path), n_ctx, n_vocab, n_chunk, tokens) as w:
        for c in chunks:
            w.write_chunk(c)
    raw = path.read_bytes()
    assert raw[:8] == b"_logits_"
    assert struct.unpack("<iii", raw[8:20]) == (n_ctx, n_vocab, n_chunk)
    assert np.array_equal(np.frombuffer(raw[20:20 + 4 * 20], "<i4"), tokens[:20])   # n_chunk * n_ctx tokens
    body = np.frombuffer(raw[100:], "<u2").reshape(n_chunk, 4, 2 * 4 + 4)   # 4 rows of nv = 12 words a chunk
    for c, rows in zip(chunks, body):
        assert np.array_equal(rows, encode_rows(c))
    with LogitsReader(str(path), n_vocab) as r:
        assert (r.n_ctx, r.n_vocab, r.n_chunk) == (n_ctx, n_vocab, n_chunk)
        assert np.array_equal(r.tokens, tokens[:20])
        assert np.array_equal(r.read_chunk(0), body[0]) and np.array_equal(r.read_chunk(1), body[1])


def test_kl_of_a_model_against_itself_is_zero():
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 2, (200, 50)).astype(np.float32)
    targets = rng.integers(0, 50, 200)
    same, other = KLStats(), KLStats()
    same.add(logits, targets, encode_rows(logits))
    other.add(logits + rng.normal(0, 1, logits.shape).astype(np.float32), targets, encode_rows(logits))
    assert abs(same.kld()[0]) < 1e-5 and same.same_top()[0] == 1.0
    assert same.log_ppl()[0] == pytest.approx(same.log_ppl_base()[0], abs=1e-4)
    assert other.kld()[0] > 0.05 and other.same_top()[0] < 1.0


def _write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


def test_bad_files_name_the_file_and_field(tmp_path):
    with pytest.raises(LogitsFileError, match="failed to open .*missing.kl"):
        LogitsReader(str(tmp_path / "missing.kl"))
    bad = _write(tmp_path / "magic.kl", b"_notlog_" + struct.pack("<iii", 4, 5, 1))
    with pytest.raises(LogitsFileError, match="magic.kl does not look like a file containing log-probabilities"):
        LogitsReader(bad)
    short = _write(tmp_path / "short.kl", b"_logits_" + struct.pack("<i", 4))
    with pytest.raises(LogitsFileError, match="short.kl: failed reading n_ctx, n_vocab, n_chunk"):
        LogitsReader(short)
    neg = _write(tmp_path / "neg.kl", b"_logits_" + struct.pack("<iii", 4, -5, 1))
    with pytest.raises(LogitsFileError, match="neg.kl: n_vocab is -5, expected at least 1"):
        LogitsReader(neg)
    cut = _write(tmp_path / "cut.kl", b"_logits_" + struct.pack("<iii", 4, 5, 1) + b"\0" * 16)
    with pytest.raises(LogitsFileError, match="cut.kl: 36 bytes, but n_ctx 4, n_vocab 5 and n_chunk 1 make 56"):
        LogitsReader(cut)
    good = tmp_path / "good.kl"
    with LogitsWriter(str(good), 4, 5, 1, np.zeros(4, np.int32)) as w:
        w.write_chunk(np.zeros((1, 5), np.float32))
    with pytest.raises(LogitsFileError, match="good.kl: inconsistent vocabulary: n_vocab is 5 in the file, "
                                              "the model has 9 tokens"):
        LogitsReader(str(good), 9)
    oob = bytearray(good.read_bytes())
    oob[20:24] = struct.pack("<i", 7)
    with pytest.raises(LogitsFileError, match="oob.kl: token 0 is 7, outside the vocabulary of 5"):
        LogitsReader(_write(tmp_path / "oob.kl", bytes(oob)))
