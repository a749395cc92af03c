"""scripts/record_llama_kv_kl.py's arithmetic, against hand-worked examples: the exact KL, the
top-N KL with the rest lumped into one bucket, the server's rows renormalised, the chunks and
their targets, the K/V pair option (no server, no device)."""

import argparse
import math

import numpy as np
import pytest
from file_modules import load

kvkl = load("scripts", "record_llama_kv_kl")


def logs(*probs):
    return np.log(np.array(probs, np.float64))


def test_kl_of_a_hand_example():
    p, q = logs(0.5, 0.3, 0.2), logs(0.4, 0.4, 0.2)
    want = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)
    assert kvkl.kl_rows(p, q)[0] == pytest.approx(want, rel=1e-12)
    assert kvkl.kl_rows(p, p)[0] == pytest.approx(0, abs=1e-15)


def test_top_n_kl_lumps_the_rest_of_the_union():
    """Top-1 of p is token 0, of q token 1: the union {0, 1}, the rest {2, 3} one bucket each side
    (p: 0.2 + 0.1, q: 0.1 + 0.2), so the bucket hides the swap of tokens 2 and 3."""
    p, q = logs(0.4, 0.3, 0.2, 0.1), logs(0.3, 0.4, 0.1, 0.2)
    want = 0.4 * math.log(0.4 / 0.3) + 0.3 * math.log(0.3 / 0.4) + 0.3 * math.log(0.3 / 0.3)
    assert kvkl.top_n_kl(p, q, 1) == pytest.approx(want, rel=1e-12)
    exact = kvkl.kl_rows(p, q)[0]
    assert kvkl.top_n_kl(p, q, 1) < exact
    assert kvkl.top_n_kl(p, q, 4) == pytest.approx(exact, rel=1e-12)


def test_top_n_kl_with_unequal_rests():
    p, q = logs(0.7, 0.2, 0.1), logs(0.5, 0.1, 0.4)
    want = 0.7 * math.log(0.7 / 0.5) + 0.3 * math.log(0.3 / 0.5)
    assert kvkl.top_n_kl(p, q, 1) == pytest.approx(want, rel=1e-12)
    assert kvkl.top_n_kl(p, q, 1) <= kvkl.kl_rows(p, q)[0]


def test_dense_row_renormalises_the_servers_list():
    """The server's probabilities total 1.0001 (its float32 sum): the row is scaled back to 1; an
    underflowed probability (float lowest) counts as e^-104."""
    ids = [2, 0, 1, 3]
    lp = np.log([0.5001, 0.3, 0.2, 1.0])
    lp[3] = -3.4028234663852886e38
    row = kvkl.dense_row(ids, lp, 4)
    assert np.exp(row).sum() == pytest.approx(1.0, abs=1e-15)
    assert np.exp(row[2]) / np.exp(row[0]) == pytest.approx(0.5001 / 0.3)
    assert row[3] == pytest.approx(-104.0 - math.log(1.0001), abs=1e-9)


def test_dense_row_refuses_a_partial_list():
    with pytest.raises(ValueError, match="one log-probability for each of 4 tokens, got 3"):
        kvkl.dense_row([0, 1, 2], np.log([0.5, 0.3, 0.2]), 4)
    with pytest.raises(ValueError, match="3 distinct"):
        kvkl.dense_row([0, 1, 2, 2], np.log([0.4, 0.3, 0.2, 0.1]), 4)


def test_figures_of_two_positions():
    base = np.stack([logs(0.6, 0.3, 0.1), logs(0.2, 0.5, 0.3)])
    other = np.stack([logs(0.5, 0.4, 0.1), logs(0.2, 0.3, 0.5)])
    f = kvkl.figures(base, other, np.array([0, 2]), top_n=3)
    kl = [0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.4), 0.5 * math.log(0.5 / 0.3) + 0.3 * math.log(0.3 / 0.5)]
    assert f.kl == pytest.approx(np.mean(kl)) and f.kl_max == pytest.approx(max(kl))
    assert f.kl_top_n == pytest.approx(f.kl)
    assert f.same_top == 0.5
    assert f.ppl_ratio == pytest.approx(math.sqrt((0.6 * 0.3) / (0.5 * 0.5)))
    assert f.count == 2


def test_chunks_put_bos_first_and_score_the_second_half():
    tokens = list(range(10, 30))
    got = list(kvkl.chunks(tokens, 8, 2, bos=1))
    assert [c.tolist() for c, _ in got] == [[1, 11, 12, 13, 14, 15, 16, 17], [1, 19, 20, 21, 22, 23, 24, 25]]
    assert [t.tolist() for _, t in got] == [[15, 16, 17], [23, 24, 25]]
    assert next(kvkl.chunks(tokens, 8, 1, bos=None))[0].tolist() == list(range(10, 18))


def test_kv_pairs_option():
    assert kvkl.parse_pairs("Q8_0/q4_0,q4_1") == [("q8_0", "q4_0"), ("q4_1", "q4_1")]
    with pytest.raises(argparse.ArgumentTypeError, match="'q9_0' is no KV type"):
        kvkl.parse_pairs("q8_0/q9_0")
    with pytest.raises(argparse.ArgumentTypeError, match="at least one"):
        kvkl.parse_pairs(",")
