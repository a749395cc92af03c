"""Sampling the next token from logits on the host, in llama.cpp's order: logit bias ->
penalties (repeat, frequency, presence) -> DRY -> top-n-sigma -> top-k -> typical -> top-p -> min-p ->
XTC -> temperature -> draw (greedy when temp <= 0), or in the order (and with only the samplers)
`SamplingParams.order` names, as llama.cpp's `samplers`. With mirostat (1 or 2) the chain after the
penalties is llama.cpp's: temperature, then the mirostat sampler, which keeps its target surprise
`mu` per sequence."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import VkrtError
from .dry import DryBreakers, dry_penalties
from .logit_adjust import LogitAdjustments, logit_adjustments
from .sampler_order import DEFAULT_ORDER


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0    # subtracted once per occurrence in the last repeat_last_n tokens
    presence_penalty: float = 0.0     # subtracted once if the token occurs there at all
    typical_p: float = 1.0            # locally typical sampling (1: off)
    logit_bias: tuple = ()            # (token id, bias) pairs added to the logits (-inf bans a token)
    top_n_sigma: float = -1.0         # keep logits within n standard deviations of the best (<= 0: off)
    xtc_probability: float = 0.0      # exclude top choices: how often (0: off)
    xtc_threshold: float = 0.1        # ... the tokens above this probability, all but the least likely
    dynatemp_range: float = 0.0       # dynamic temperature: temperature +- this, by the candidates' entropy
    dynatemp_exponent: float = 1.0
    min_keep: int = 0                 # the fewest candidates top-k, typical, top-p, min-p and XTC leave
    dry_multiplier: float = 0.0       # DRY (vkrt/engine/dry.py): 0 off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1      # tokens of context it looks at (-1: all)
    dry_breakers: tuple = ()          # (head token, tail tokens) of the sequence breakers (dry.breaker_sequences)
    mirostat: int = 0                 # 1 or 2: mirostat v1/v2 instead of top-k ... min-p
    mirostat_tau: float = 5.0         # target surprise (bits)
    mirostat_eta: float = 0.1         # learning rate of mu
    seed: int | None = None
    order: tuple = DEFAULT_ORDER      # the samplers applied, in this order (sampler_order.parse_order)

    @property
    def penalized(self) -> bool:
        return "penalties" in self.order and \
            (self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0)

    @property
    def dry(self) -> bool:
        return "dry" in self.order and \
            self.dry_multiplier != 0.0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0

    @property
    def needs_row(self) -> bool:
        """Whether a step changes logits anywhere in the row before any cut (bias, penalties, DRY):
        then the GPU's argmax does not stand for the row, and its best candidates only once the
        GPU has applied Sampler.adjustments() to it."""
        return self.penalized or bool(self.logit_bias) or self.dry

    @property
    def greedy(self) -> bool:
        """Temperature 0 (in the chain): the best token (without a temperature sampler the chain
        draws at temperature 1, as llama.cpp's does)."""
        return self.temperature <= 0.0 and "temperature" in self.order

    @property
    def k(self) -> int:
        """The top-k cut in effect (<= 0: none): top_k, raised to min_keep; 0 when the chain has
        no top_k sampler."""
        if "top_k" not in self.order:
            return 0
        return max(self.top_k, self.min_keep) if self.top_k > 0 else self.top_k

    @property
    def sigma(self) -> bool:
        """Whether top-n-sigma cuts (it reads the whole row)."""
        return self.top_n_sigma > 0 and "top_n_sigma" in self.order

    @property
    def before_top_k(self) -> tuple:
        """The samplers the chain runs before top_k, past the penalties and DRY."""
        i = self.order.index("top_k") if "top_k" in self.order else len(self.order)
        return tuple(n for n in self.order[:i] if n not in ("penalties", "dry"))


GREEDY = SamplingParams(temperature=0.0)


class Sampler:
    """Stateful per sequence: the seeded generator and the recent tokens for the penalty."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.history: list[int] = []   # the latest tokens (window of them): penalties and DRY look at them
        self.mu = 2.0 * params.mirostat_tau   # mirostat's running maximum surprise
        self._dry = DryBreakers(params.dry_breakers) if params.dry else None

    @property
    def window(self) -> int | None:
        """How many of the latest tokens the sampler looks at (None: all of them)."""
        p = self.params
        if p.dry and p.dry_penalty_last_n < 0:
            return None
        return max(p.repeat_last_n, p.dry_penalty_last_n if p.dry else 0, 0)

    def accept(self, token: int) -> None:
        self.history.append(int(token))
        window = self.window
        if window is not None and len(self.history) > window:
            del self.history[:len(self.history) - window]

    def adjustments(self) -> LogitAdjustments | None:
        """What logit bias, the penalties and DRY change in the next row (None: nothing), as the
        host applies it in sample() and the GPU before picking candidates."""
        p = self.params
        dry = None
        if self._dry is not None and self.history:
            context = self.history if p.dry_penalty_last_n < 0 else self.history[-p.dry_penalty_last_n:]
            dry = dry_penalties(context, p.dry_multiplier, p.dry_base, p.dry_allowed_length, self._dry)
        return logit_adjustments(p, self.history, dry)

    def sample(self, logits: np.ndarray) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        adjust = self.adjustments()
        if adjust is not None:
            logits = adjust.apply(logits)
        if p.greedy:
            return int(np.argmax(logits))
        if p.mirostat:
            if p.temperature <= 0:   # llama.cpp's temperature sampler at 0: the best token only
                return int(np.argmax(logits))
            scores = logits.astype(np.float64)
            with np.errstate(over="ignore"):   # shifted first: a tiny temperature gives -inf, not NaN
                return self._mirostat((scores - scores.max()) / p.temperature)
        return self._chain(np.arange(logits.size), logits, ranked=False)

    def takes_candidates(self, n: int, adjusted: bool = False) -> bool:
        """Whether sample_top over the best n logits picks as sample() over the whole row would:
        greedy, or a top-k cut of at most n with nothing before it that reads the whole row
        (top-n-sigma, typical, top-p, min-p, XTC, dynamic temperature; mirostat). Logit bias,
        penalties and DRY (needs_row) only where the GPU applied adjustments() to the row before
        picking the candidates (`adjusted`)."""
        p = self.params
        if p.needs_row and not adjusted:
            return False
        if p.greedy:
            return True
        if p.mirostat or not 0 < p.k <= n:
            return False
        before = p.before_top_k
        return not (any(step in before for step in ("typ_p", "top_p", "min_p", "xtc"))
                    or (p.sigma and "top_n_sigma" in before) or ("temperature" in before and p.dynatemp_range > 0))

    def sample_top(self, values: np.ndarray, ids: np.ndarray, adjusted: bool = False) -> int:
        """Sample from the best candidates of a row (values descending, their token ids), as
        sample() would from the whole row (see takes_candidates; `adjusted`: the row had
        adjustments() applied)."""
        if not self.takes_candidates(len(values), adjusted):
            raise VkrtError(f"sampling from {len(values)} candidates needs greedy or top_k in 1..{len(values)} and "
                            f"nothing that reads the whole row (Sampler.takes_candidates), got {self.params}")
        if self.params.greedy:
            return int(ids[0])   # the best, the lowest id on ties: np.argmax's pick
        return self._chain(np.asarray(ids, np.int64), np.asarray(values, np.float32), ranked=True)

    def _mirostat(self, scores: np.ndarray) -> int:
        """llama.cpp's mirostat (v1: top-k from the estimated Zipf exponent of the best 100; v2:
        the tokens whose surprise is at most mu) over the temperature-scaled logits."""
        p = self.params
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        if p.mirostat == 2:
            keep = np.flatnonzero(probs >= 2.0 ** -self.mu)
            keep = keep if keep.size else np.array([int(np.argmax(scores))])
            return _mirostat_pick(self, keep, scores[keep])
        m = min(100, scores.size)
        top = np.argpartition(-scores, m - 1)[:m] if m < scores.size else np.arange(scores.size)
        top_p = np.sort(probs[top])[::-1]
        i = np.arange(m - 1)
        t = np.log((i + 2) / (i + 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.log(top_p[:-1] / top_p[1:])
        s_hat = float(np.sum(t * b) / np.sum(t * t)) if m > 1 else 1.0
        eps = s_hat - 1
        k = (eps * 2.0 ** self.mu) / (1 - float(scores.size) ** -eps) if eps else float(scores.size)
        k = max(int(k ** (1 / s_hat)) if np.isfinite(k) and k > 0 else 1, 1)
        keep = np.argpartition(-scores, k - 1)[:k] if k < scores.size else np.arange(scores.size)
        return _mirostat_pick(self, keep, scores[keep])

    def _chain(self, ids: np.ndarray, logits: np.ndarray, ranked: bool) -> int:
        """The samplers of params.order after the penalties and DRY, then the draw, over the
        candidates `ids` with `logits` (`ranked`: best first already): top-n-sigma, top-k (a cut
        of the unranked row keeps k and ranks only those), typical, top-p, min-p, XTC and
        temperature (dynamic with dynatemp_range) as llama.cpp's; each renormalises the
        probabilities of what it keeps, and samplers after temperature see the scaled logits."""
        p = self.params
        keep_n = max(p.min_keep, 1)
        probs = None
        for step in p.order:
            if step in ("penalties", "dry"):
                continue
            if step == "top_n_sigma":
                if p.sigma:
                    logits = _top_n_sigma(logits, p.top_n_sigma)
                    probs = None
                continue
            if step == "top_k":
                if 0 < p.k < ids.size:
                    if ranked:
                        ids, logits = ids[:p.k], logits[:p.k]
                    else:
                        keep = np.argpartition(-logits, p.k - 1)[:p.k]
                        ids, logits = ids[keep], logits[keep]
                    probs = None
                continue
            if not ranked:
                order = np.argsort(-logits, kind="stable")
                ids, logits, ranked = ids[order], logits[order], True
            if probs is None:
                logits = logits.astype(np.float64)
                probs = np.exp(logits - logits[0])
                probs /= probs.sum()
            if step == "typ_p" and p.typical_p < 1.0:
                ids, logits, probs = _typical(ids, logits, probs, p.typical_p, keep_n)
            elif step == "top_p" and p.top_p < 1.0:
                cut = max(int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1, keep_n)
                ids, logits, probs = ids[:cut], logits[:cut], probs[:cut] / probs[:cut].sum()
            elif step == "min_p" and p.min_p > 0.0:
                keep = probs >= p.min_p * probs[0]
                if keep.sum() >= keep_n:   # llama.cpp: too few left, and min-p leaves them all
                    ids, logits, probs = ids[keep], logits[keep], probs[keep] / probs[keep].sum()
            elif step == "xtc" and p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5 and ids.size >= 2 and \
                    self.rng.random() <= p.xtc_probability:
                # the tokens above the threshold (best first), all but the least likely of them, go
                above = int(np.argmin(probs >= p.xtc_threshold)) if not np.all(probs >= p.xtc_threshold) \
                    else ids.size
                if above > 1 and ids.size - (above - 1) >= p.min_keep:
                    ids, logits = ids[above - 1:], logits[above - 1:]
                    probs = probs[above - 1:] / probs[above - 1:].sum()
            elif step == "temperature":
                temp = p.temperature
                if p.dynatemp_range > 0 and ids.size > 1:   # llama.cpp's temp_ext: by the normalised entropy
                    with np.errstate(divide="ignore", invalid="ignore"):
                        entropy = -np.nansum(np.where(probs > 0, probs * np.log(probs), 0.0))
                    lo, hi = max(0.0, temp - p.dynatemp_range), temp + p.dynatemp_range
                    temp = lo + (hi - lo) * (entropy / np.log(ids.size)) ** p.dynatemp_exponent
                    if temp <= 0:
                        return int(ids[0])
                with np.errstate(over="ignore"):   # shifted first: a tiny temperature gives -inf, not NaN
                    logits = (logits - logits.max()) / temp
                probs = np.exp(logits)
                probs /= probs.sum()
        if not ranked:
            order = np.argsort(-logits, kind="stable")
            ids, logits = ids[order], logits[order]
        if probs is None:
            logits = logits.astype(np.float64)
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
        return int(ids[self.rng.choice(ids.size, p=probs)])


def _softmax_sorted(ids: np.ndarray, scores: np.ndarray):
    order = np.argsort(-scores, kind="stable")
    ids, scores = ids[order], scores[order]
    probs = np.exp(scores - scores[0])
    return ids, scores, probs / probs.sum()


def _mirostat_pick(sampler, ids, scores) -> int:
    """Draw from the candidates (softmax of `scores`) and move mu toward the target surprise."""
    p = sampler.params
    ids, scores, probs = _softmax_sorted(ids, scores)
    k = sampler.rng.choice(ids.size, p=probs)
    sampler.mu -= p.mirostat_eta * (-np.log2(probs[k]) - p.mirostat_tau)
    return int(ids[k])


def _typical(ids, logits, probs, mass: float, min_keep: int = 1):
    """Locally typical sampling (llama.cpp's): the tokens whose surprise is nearest the entropy,
    until their probability passes `mass`; returned best first again, probabilities renormalised."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(probs)
        entropy = -np.nansum(probs * logp)
        shift = np.abs(-logp - entropy)
    order = np.argsort(shift, kind="stable")
    over = np.nonzero((np.cumsum(probs[order]) > mass) & (np.arange(order.size) >= min_keep - 1))[0]
    keep = np.sort(order[:over[0] + 1 if over.size else order.size])   # best-first positions
    probs = probs[keep] / probs[keep].sum()
    return ids[keep], logits[keep], probs


def _top_n_sigma(logits: np.ndarray, n: float) -> np.ndarray:
    """llama.cpp's top-n-sigma: logits below max - n * std (over the finite ones) become -inf."""
    finite = logits[np.isfinite(logits)]
    if finite.size <= 1:
        return logits
    std = float(np.sqrt(np.mean((finite.astype(np.float64) - finite.mean(dtype=np.float64)) ** 2)))
    return np.where(logits < finite.max() - n * std, np.float32(-np.inf), logits).astype(np.float32)
