"""The statistics llama-perplexity's --kl-divergence reports: a model's log-probabilities against
a base model's stored ones (kl_file), token by token, in its float32 / float64 arithmetic."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .kl_file import decode_rows

F32 = np.float32


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """Mean and its standard error (0 for ten values or fewer), as llama-perplexity."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0


def covariance(a: float, b: float, ab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (ab / count - (a / count) * (b / count)) / (count - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama-perplexity's interpolated percentile of sorted float32 values (float32 arithmetic)."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = F32(fraction) * F32(sorted_values.size - 1)
    ip = int(p)
    p = F32(p - F32(ip))
    nxt = sorted_values[min(ip + 1, sorted_values.size - 1)]
    return float((F32(1) - p) * sorted_values[ip] + p * nxt)


def median(sorted_values: np.ndarray) -> float:
    n = sorted_values.size
    if n % 2:
        return float(sorted_values[n // 2])
    return float(F32(0.5) * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))


def safe_div(a: float, b: float) -> float:
    """a / b with C's answers where Python raises: inf, -inf or nan."""
    try:
        return a / b
    except ZeroDivisionError:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)


@dataclass
class KLStats:
    """Running sums and per-token values of a --kl-divergence run."""

    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list = field(default_factory=list)
    p_diff_values: list = field(default_factory=list)

    def add(self, logits: np.ndarray, targets: np.ndarray, base_rows: np.ndarray) -> None:
        """Score rows of `logits` [n, vocab] predicting `targets` against the base's encoded rows."""
        logits = np.asarray(logits, F32)
        n, n_vocab = logits.shape
        idx = np.arange(n)
        imax = logits.argmax(axis=1)
        hi = logits[idx, imax]
        log_sum_exp = np.log(np.exp(logits - hi[:, None]).sum(axis=1, dtype=np.float64)).astype(F32)
        base = decode_rows(base_rows, n_vocab)
        nll = hi + log_sum_exp - logits[idx, targets]
        nll_base = -base[idx, targets]
        hi = hi + log_sum_exp
        terms = np.exp(base) * (base - logits + hi[:, None])
        kld = np.where(base > F32(-16), terms, F32(0)).sum(axis=1, dtype=np.float64)
        p_diff = np.exp(-nll) - np.exp(-nll_base)
        p_diff2 = (p_diff * p_diff).astype(np.float64)
        self.sum_nll += float(nll.sum(dtype=np.float64))
        self.sum_nll2 += float((nll * nll).sum(dtype=np.float64))
        self.sum_nll_base += float(nll_base.sum(dtype=np.float64))
        self.sum_nll_base2 += float((nll_base * nll_base).sum(dtype=np.float64))
        self.sum_nll_nll_base += float((nll * nll_base).sum(dtype=np.float64))
        self.sum_kld += float(kld.sum())
        self.sum_kld2 += float((kld * kld).sum())
        self.sum_p_diff += float(p_diff.sum(dtype=np.float64))
        self.sum_p_diff2 += float(p_diff2.sum())
        self.sum_p_diff4 += float((p_diff2 * p_diff2).sum())
        self.max_p_diff = max(self.max_p_diff, float(np.abs(p_diff).max()))
        self.n_same_top += int((imax == base.argmax(axis=1)).sum())
        self.count += n
        self.kld_values.append(kld.astype(F32))
        self.p_diff_values.append(p_diff.astype(F32))

    # -- the reported figures ----------------------------------------------------------------------
    def log_ppl(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count)

    def log_ppl_base(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count)

    def log_ppl_cov(self) -> float:
        return covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, self.count)

    def log_ppl_ratio(self) -> tuple[float, float]:
        (a, da), (b, db) = self.log_ppl(), self.log_ppl_base()
        var = da * da + db * db - 2.0 * self.log_ppl_cov()
        return a - b, math.sqrt(var) if var >= 0 else math.nan

    def kld(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count)

    def p_diff_mean(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count)

    def p_diff_rms(self) -> tuple[float, float]:
        mse, dmse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count)
        rms = math.sqrt(mse)
        return rms, safe_div(0.5, rms) * dmse

    def same_top(self) -> tuple[float, float]:
        p = self.n_same_top / self.count
        return p, math.sqrt(safe_div(p * (1 - p), self.count - 1))

    def sorted_kld(self) -> np.ndarray:
        return np.sort(np.concatenate(self.kld_values))

    def sorted_p_diff(self) -> np.ndarray:
        return np.sort(np.concatenate(self.p_diff_values))
