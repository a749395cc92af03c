"""The sampler chain's order (llama.cpp's `samplers`): parsing, and the chain running only the
named samplers in the named order (numpy, no GPU)."""

import numpy as np
import pytest

from vkrt.engine.sampler import Sampler, SamplingParams
from vkrt.engine.sampler_order import DEFAULT_ORDER, parse_order
from vkrt.errors import ConfigError


def test_names_letters_and_aliases():
    assert parse_order(list(DEFAULT_ORDER)) == DEFAULT_ORDER
    assert parse_order("edskypmxt") == DEFAULT_ORDER
    assert parse_order("penalties;top-k;nucleus;temp", letters=False) == ("penalties", "top_k", "top_p", "temperature")
    assert parse_order(["typical", "min-p", "TEMPERATURE"]) == ("typ_p", "min_p", "temperature")
    assert parse_order([]) == ()


@pytest.mark.parametrize("value,match", [
    (["top_k", "bogus"], "unknown sampler 'bogus'"),
    ("kz", "unknown sampler letter"),
    (["top_k", "top_k"], "named twice"),
    (["infill"], "infill sampler is not supported"),
    (["top_k", "penalties"], "penalties must come before"),
    ("kd", "dry must come before"),
    (5, "must be a list"),
])
def test_refused(value, match):
    with pytest.raises(ConfigError, match=match):
        parse_order(value)


def draws(params, logits, n=300):
    s = Sampler(params)
    return [s.sample(logits) for _ in range(n)]


LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))


def test_default_order_spelled_out_draws_the_same():
    base = SamplingParams(temperature=0.9, top_k=3, top_p=0.9, min_p=0.05, seed=4)
    spelled = SamplingParams(temperature=0.9, top_k=3, top_p=0.9, min_p=0.05, seed=4, order=parse_order("edskypmxt"))
    assert draws(base, LOGITS) == draws(spelled, LOGITS)


def test_only_the_named_samplers_run():
    """top_k=1 forces the best token only while top_k is in the chain; top_p=0.4 keeps only the
    best while top_p is."""
    assert set(draws(SamplingParams(temperature=1.0, top_k=1, seed=1), LOGITS)) == {0}
    assert len(set(draws(SamplingParams(temperature=1.0, top_k=1, seed=1, order=("temperature",)), LOGITS))) > 2
    assert set(draws(SamplingParams(temperature=1.0, top_k=0, top_p=0.4, min_p=0.0, seed=1), LOGITS)) == {0}
    free = SamplingParams(temperature=1.0, top_k=0, top_p=0.4, min_p=0.0, seed=1, order=("top_k", "temperature"))
    assert len(set(draws(free, LOGITS))) > 2


def test_temperature_before_top_p_sees_the_scaled_probabilities():
    """At temperature 4 the four probabilities flatten to ~[0.31, 0.27, 0.23, 0.18]: top-p 0.5
    after it keeps two tokens, before it (on [0.5, 0.3, ...]) one."""
    p = dict(temperature=4.0, top_k=0, top_p=0.5, min_p=0.0, seed=2)
    assert set(draws(SamplingParams(**p, order=("top_p", "temperature")), LOGITS)) == {0}
    assert set(draws(SamplingParams(**p, order=("temperature", "top_p")), LOGITS)) == {0, 1}


def test_penalties_left_out_are_not_applied():
    p = dict(temperature=0.0, repeat_penalty=100.0, repeat_last_n=8)
    with_pen, without = Sampler(SamplingParams(**p)), Sampler(SamplingParams(**p, order=("top_k", "temperature")))
    for s in (with_pen, without):
        s.accept(0)
    assert with_pen.sample(LOGITS) == 1 and without.sample(LOGITS) == 0
    assert without.adjustments() is None


def test_no_temperature_sampler_draws_at_temperature_one():
    params = SamplingParams(temperature=0.0, top_k=0, seed=3, order=("top_k",))
    assert not params.greedy
    assert len(set(draws(params, LOGITS))) > 2


def test_candidates_only_where_nothing_before_top_k_reads_the_row():
    rng = np.random.default_rng(0)
    row = rng.standard_normal(500).astype(np.float32)
    top = np.argsort(-row, kind="stable")[:64]
    for order, takes in ((DEFAULT_ORDER, True), (("temperature", "top_k", "top_p"), True),
                         (("top_p", "top_k", "temperature"), False), (("min_p", "temperature"), False)):
        params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=9, order=order)
        assert Sampler(params).takes_candidates(64) is takes, order
        if takes:   # the same draws from the 64 best as from the whole row
            a, b = Sampler(params), Sampler(params)
            assert [a.sample(row) for _ in range(50)] == [b.sample_top(row[top], top) for _ in range(50)]
