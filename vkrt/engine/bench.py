"""llama-bench-style measurements: prompt processing (pp) and text generation (tg) throughput,
optionally at a KV depth, repeated, with mean and standard deviation."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from .generate import random_tokens


@dataclass(frozen=True)
class BenchTest:
    n_prompt: int
    n_gen: int
    n_depth: int = 0

    @property
    def name(self) -> str:
        if self.n_prompt and self.n_gen:
            base = f"pp{self.n_prompt}+tg{self.n_gen}"
        elif self.n_prompt:
            base = f"pp{self.n_prompt}"
        else:
            base = f"tg{self.n_gen}"
        return f"{base} @ d{self.n_depth}" if self.n_depth else base


def _stddev(samples: list) -> float:
    """Sample standard deviation; 0 for a single sample (as llama-bench prints it)."""
    return statistics.stdev(samples) if len(samples) > 1 else 0.0


@dataclass
class BenchResult:
    test: BenchTest
    samples_ns: list[int] = field(default_factory=list)

    @property
    def samples_ts(self) -> list[float]:
        n = self.test.n_prompt + self.test.n_gen
        return [n / (ns / 1e9) for ns in self.samples_ns]

    @property
    def avg_ns(self) -> float:
        return statistics.mean(self.samples_ns)

    @property
    def stddev_ns(self) -> float:
        return _stddev(self.samples_ns)

    @property
    def avg_ts(self) -> float:
        return statistics.mean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return _stddev(self.samples_ts)


def run_test(engine, test: BenchTest, repetitions: int, seed: int = 0) -> BenchResult:
    """One warm-up, then `repetitions` timed runs; the KV cache is cleared (and the depth
    prefilled, untimed) before each. Generation is greedy with the token picked on the GPU."""
    vocab = engine.model.cfg.vocab_size
    result = BenchResult(test)
    for rep in range(repetitions + 1):
        engine.reset()
        if test.n_depth:
            engine.eval(random_tokens(test.n_depth, vocab, seed + 1000 + rep))
        prompt = random_tokens(test.n_prompt, vocab, seed + rep)
        t0 = time.perf_counter_ns()
        if test.n_prompt:
            engine.eval(prompt)
        token = prompt[-1] if prompt else 1
        if test.n_gen:   # generation as users get it: greedy, the token chosen on the GPU
            for _ in engine.greedy(token, 0, test.n_gen):
                pass
        elapsed = time.perf_counter_ns() - t0
        if rep:  # the first run warms up (records the command sequences)
            result.samples_ns.append(elapsed)
    engine.reset()
    return result
