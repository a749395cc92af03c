"""The host sampler's logit bias, penalties and typical sampling against literal ports of
llama.cpp's samplers (numpy, no GPU)."""

import math

import numpy as np
import pytest

from vkrt.engine.sampler import Sampler, SamplingParams


def test_logit_bias_adds_and_bans():
    logits = np.array([1.0, 5.0, 3.0, 4.9], np.float32)
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == 1
    assert Sampler(SamplingParams(temperature=0, logit_bias=((1, -math.inf),))).sample(logits) == 3
    assert Sampler(SamplingParams(temperature=0, logit_bias=((2, 2.5),))).sample(logits) == 2
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3,
                               logit_bias=((1, -math.inf), (3, -math.inf))))
    assert {s.sample(logits) for _ in range(50)} <= {0, 2}


def llama_penalties(logits, recent, repeat, freq, present):
    """llama_sampler_penalties_apply: per token of the window, its count."""
    out = logits.astype(np.float32).copy()
    counts = {}
    for t in recent:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        out[t] = out[t] * repeat if out[t] <= 0 else out[t] / repeat
        out[t] -= np.float32(c * freq + (c > 0) * present)
    return out


@pytest.mark.parametrize("repeat, freq, present", [(1.0, 0.5, 0.0), (1.0, 0.0, 1.5), (1.3, 0.7, 0.4)])
def test_penalties_match_llama(repeat, freq, present, monkeypatch):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(50).astype(np.float32)
    recent = [3, 7, 3, 3, 12, 7, 40]
    p = SamplingParams(temperature=0, repeat_penalty=repeat, frequency_penalty=freq, presence_penalty=present,
                       repeat_last_n=64)
    s = Sampler(p)
    for t in recent:
        s.accept(t)
    seen = []
    monkeypatch.setattr(np, "argmax", lambda a: seen.append(np.array(a)) or 0)
    s.sample(logits)
    np.testing.assert_allclose(seen[0], llama_penalties(logits, recent, repeat, freq, present), rtol=1e-6)
    assert not s.takes_candidates(64)


def llama_typical(logits, mass):
    """llama_sampler_typical_apply over candidates sorted best first: kept ids in typical order."""
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    shifted = [abs(-math.log(p) - entropy) for p in probs]
    order = sorted(range(len(probs)), key=lambda i: shifted[i])
    cum, last = 0.0, len(order)
    for i, j in enumerate(order):
        cum += probs[j]
        if cum > mass:
            last = i + 1
            break
    return set(order[:last])


@pytest.mark.parametrize("mass", [0.2, 0.5, 0.9, 0.99])
def test_typical_keeps_llamas_tokens(mass):
    rng = np.random.default_rng(int(mass * 100))
    logits = np.sort(rng.standard_normal(30) * 2)[::-1].copy()
    from vkrt.engine.sampler import _typical
    probs = np.exp(logits - logits[0])
    probs /= probs.sum()
    ids, kept_logits, kept_probs = _typical(np.arange(30), logits, probs, mass)
    assert set(ids.tolist()) == llama_typical(logits, mass)
    assert np.all(np.diff(kept_logits) <= 0) and math.isclose(kept_probs.sum(), 1.0)


def test_typical_after_top_k_still_takes_candidates():
    """Typical sampling runs on the top-k survivors, so 64 GPU candidates give the same draws."""
    rng = np.random.default_rng(5)
    row = rng.standard_normal(1000).astype(np.float32)
    p = SamplingParams(temperature=0.8, top_k=40, typical_p=0.7, seed=11)
    a, b = Sampler(p), Sampler(p)
    assert a.takes_candidates(64)
    order = np.argsort(-row, kind="stable")[:64]
    draws_row = [a.sample(row) for _ in range(20)]
    draws_top = [b.sample_top(row[order], order) for _ in range(20)]
    assert draws_row == draws_top


def llama_top_n_sigma(logits, n):
    """llama_sampler_top_n_sigma_apply."""
    valid = [v for v in logits if v != -np.inf]
    mx, mean = max(valid), sum(valid) / len(valid)
    std = math.sqrt(sum((v - mean) ** 2 for v in valid) / len(valid))
    return np.array([-np.inf if v < mx - n * std else v for v in logits], np.float32)


@pytest.mark.parametrize("n", [0.5, 1.0, 2.0])
def test_top_n_sigma_matches_llama(n):
    from vkrt.engine.sampler import _top_n_sigma
    rng = np.random.default_rng(int(n * 10))
    logits = (rng.standard_normal(200) * 3).astype(np.float32)
    logits[5] = -np.inf
    np.testing.assert_array_equal(_top_n_sigma(logits, n), llama_top_n_sigma(logits, n))
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, top_n_sigma=n, seed=1))
    kept = set(np.flatnonzero(np.isfinite(llama_top_n_sigma(logits, n))).tolist())
    assert {s.sample(logits) for _ in range(200)} <= kept
    assert not s.takes_candidates(64)


def test_xtc_excludes_the_top_choices():
    """Probability 1: every token above the threshold but the least likely of them is excluded
    (llama.cpp's XTC); a threshold above 0.5 turns it off; probability 0 never fires."""
    logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05], np.float32))
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=2)
    s = Sampler(SamplingParams(**base, xtc_probability=1.0, xtc_threshold=0.12))
    assert {s.sample(logits) for _ in range(100)} == {2, 3, 4}   # 0.4 and 0.3 go; 0.15 stays
    s = Sampler(SamplingParams(**base, xtc_probability=1.0, xtc_threshold=0.6))
    assert 0 in {s.sample(logits) for _ in range(100)}
    assert Sampler(SamplingParams(**{**base, "top_k": 5}, xtc_probability=1.0, xtc_threshold=0.12)).takes_candidates(64)


def llama_mirostat_v2_kept(probs_sorted, mu):
    """The truncation of llama_sampler_mirostat_v2_apply: the prefix whose surprise is at most mu."""
    n = next((i for i, q in enumerate(probs_sorted) if -math.log2(q) > mu), len(probs_sorted))
    return max(n, 1)


def llama_mirostat_v1_k(probs_sorted, mu, n_vocab, m=100):
    num = den = 0.0
    for i in range(min(m - 1, len(probs_sorted) - 1)):
        t = math.log((i + 2) / (i + 1))
        num += t * math.log(probs_sorted[i] / probs_sorted[i + 1])
        den += t * t
    s_hat = num / den
    eps = s_hat - 1
    return max(int(((eps * 2 ** mu) / (1 - n_vocab ** -eps)) ** (1 / s_hat)), 1)


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_matches_llama(version, monkeypatch):
    """The candidates mirostat draws from are llama.cpp's, and mu moves by eta times the surprise
    error of the drawn token within them."""
    from vkrt.engine import sampler as S
    rng = np.random.default_rng(version)
    logits = (rng.standard_normal(500) * 2).astype(np.float32)
    p = SamplingParams(temperature=0.8, mirostat=version, mirostat_tau=4.0, mirostat_eta=0.2, seed=3)
    s = Sampler(p)
    assert not s.takes_candidates(64)
    seen = []
    real = S._mirostat_pick
    monkeypatch.setattr(S, "_mirostat_pick", lambda smp, ids, sc: seen.append(len(ids)) or real(smp, ids, sc))
    for _ in range(5):
        mu = s.mu
        scores = logits.astype(np.float64) / 0.8
        probs = np.sort(np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum())[::-1]
        want = llama_mirostat_v2_kept(probs, mu) if version == 2 else llama_mirostat_v1_k(probs, mu, logits.size)
        tok = s.sample(logits)
        assert seen[-1] == want
        kept = np.sort(scores)[::-1][:want]
        q = np.exp(kept - kept[0]) / np.exp(kept - kept[0]).sum()
        rank = int(np.flatnonzero(np.argsort(-scores, kind="stable") == tok)[0])
        assert math.isclose(s.mu, mu - 0.2 * (-math.log2(q[rank]) - 4.0), rel_tol=1e-9)


class _Capture:
    """Stands in for the generator's choice: records the probabilities of the final draw."""

    def __init__(self, rng):
        self.rng, self.p = rng, None

    def random(self):
        return self.rng.random()

    def choice(self, n, p):
        self.p = np.asarray(p)
        return 0


def test_dynamic_temperature_matches_llama():
    """llama.cpp's temp_ext: temperature from min to max by the candidates' normalised entropy."""
    logits = np.array([3.0, 2.5, 1.0, 0.5, -1.0], np.float32)
    p = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, dynatemp_range=0.5, dynatemp_exponent=1.5)
    s = Sampler(p)
    s.rng = cap = _Capture(s.rng)
    s.sample(logits)
    x = np.sort(logits.astype(np.float64))[::-1]
    q = np.exp(x - x[0]) / np.exp(x - x[0]).sum()
    entropy = -(q * np.log(q)).sum()
    temp = 0.3 + (1.3 - 0.3) * (entropy / math.log(5)) ** 1.5
    want = np.exp((x - x[0]) / temp) / np.exp((x - x[0]) / temp).sum()
    np.testing.assert_allclose(cap.p, want, rtol=1e-12)


@pytest.mark.parametrize("fields, kept", [({"top_p": 0.05}, 3), ({"min_p": 0.9}, 5), ({"top_k": 2}, 3),
                                          ({"typical_p": 0.01}, 3)])
def test_min_keep(fields, kept):
    """top-k, top-p and typical leave at least min_keep candidates; min-p that would leave fewer
    leaves them all (llama.cpp's rule)."""
    logits = np.array([5.0, 1.0, 0.9, 0.8, 0.7], np.float32)
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, min_keep=3)
    s = Sampler(SamplingParams(**{**base, **fields}))
    s.rng = cap = _Capture(s.rng)
    s.sample(logits)
    assert cap.p.size == kept


def llama_dry_repeats(context, rep_limit):
    """Steps 2 and 3 of llama_sampler_dry_apply: the reversed Z-algorithm's repeat counts, then
    the longest repetition each following token would extend (an independent formulation)."""
    n = len(context)
    rat = lambda i: context[n - 1 - i]   # noqa: E731  (i tokens from the end)
    count = [0] * n
    last, lt, rt = n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat(m) == rat(m + k):
                m += 1
            count[last - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            pair, right = k - lt, rt - k + 1
            if count[last - pair] < right:
                count[last - k] = min(count[last - pair], rep_limit)
            else:
                i = rt + 1
                while i < n and rat(i) == rat(i - k):
                    i += 1
                count[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    out = {}
    for i in range(n - 1):
        tok = rat(n - 2 - i)
        out[tok] = max(out.get(tok, 0), count[i])
    return out


def test_dry_repeat_lengths_match_llamas_z_algorithm():
    from vkrt.engine.dry import DryBreakers, dry_penalties
    rng = np.random.default_rng(0)
    for _ in range(200):
        ctx = rng.integers(0, 4, rng.integers(3, 40)).tolist()
        ref = {t: m for t, m in llama_dry_repeats(ctx, len(ctx)).items() if m >= 2}
        got = dry_penalties(ctx, 1.0, 2.0, 2, DryBreakers(()))
        assert got == {t: 2.0 ** (m - 2) for t, m in ref.items()}, ctx


def test_dry_cases():
    """llama.cpp's own test cases (tests/test-sampling.cpp): uniform logits over 4-5 tokens."""
    from vkrt.engine.dry import DryBreakers, dry_penalties

    def probs(n, ctx, mult, base, allowed, breakers=()):
        logits = np.zeros(n)
        for t, pen in dry_penalties(ctx, mult, base, allowed, DryBreakers(breakers)).items():
            logits[t] -= pen
        e = np.exp(logits)
        return e / e.sum()

    np.testing.assert_allclose(probs(4, [0, 1], 1.0, 1.1, 2), [0.25] * 4)
    np.testing.assert_allclose(probs(4, [0, 1, 2, 0, 1], 1.0, 1.1, 2), [0.296923, 0.296923, 0.109232, 0.296923],
                               atol=1e-6)
    np.testing.assert_allclose(probs(5, [0, 1, 3, 4, 0, 1], 1.0, 1.1, 2, ((3, ()),)), [0.2] * 5)   # 3 breaks
    np.testing.assert_allclose(probs(5, [0, 1, 2, 3, 4, 0, 1], 1.0, 1.1, 4), [0.2] * 5)   # too short to count
    # a repetition spanning a breaker counts only the tokens after it: [0 3 1 2 0 (3) 1] repeats
    # "0 3 1" (2 would extend it), but one token follows the breaker, fewer than allowed
    assert probs(5, [0, 3, 1, 2, 0, 3, 1], 1.0, 1.1, 2)[2] < 0.2
    np.testing.assert_allclose(probs(5, [0, 3, 1, 2, 0, 3, 1], 1.0, 1.1, 2, ((3, ()),)), [0.2] * 5)



def test_dry_with_a_base_past_float32_stays_finite():
    """A base whose log passes float32's largest exponent clamps the power at base^0 (it overflowed:
    max_exp came out 0, read as 'no clamp')."""
    from vkrt.engine.dry import DryBreakers, dry_penalties
    got = dry_penalties([1, 2, 1, 2, 1, 2], 2.0, 1e308, 0, DryBreakers(()))
    assert got and all(v == 2.0 for v in got.values())
    assert all(math.isfinite(v) for v in dry_penalties([1, 2, 1, 2, 1, 2], 1.0, 1e30, 0, DryBreakers(())).values())


@pytest.mark.parametrize("temperature", [0.0, 1e-320, 1e-30])
def test_mirostat_at_a_tiny_temperature_takes_the_best_token(temperature):
    logits = np.array([0.5, 3.0, -1.0, 2.9], np.float32)
    for version in (1, 2):
        assert Sampler(SamplingParams(temperature=temperature, mirostat=version, seed=1)).sample(logits) == 1
