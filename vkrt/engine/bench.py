"""llama-bench-style measurements: prompt processing (pp) and text generation (tg) throughput,
optionally at a KV depth, repeated, with mean and standard deviation. As llama-bench, pp
evaluates random tokens and tg decodes a new random token each step."""

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
    spec: str | None = None   # a copying generation test (run_copy_test): "plain", or the speculation's type

    @property
    def name(self) -> str:
        if self.spec is not None:
            base = f"copy{self.n_gen}" + ("" if self.spec == "plain" else f" +{self.spec}")
            return f"{base} @ d{self.n_depth}" if self.n_depth else base
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
    traffic: dict | None = None   # expert-traffic counters' change over the timed runs (TRAFFIC_COUNTERS)
    drafted: int = 0              # copy tests with speculation: draft tokens over the timed runs
    accepted: int = 0             # ... and those accepted

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

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

    @property
    def expert_shares(self) -> tuple[float, float, float] | None:
        """Shares of the (token, expert) pairs of the timed runs that ran from the GPU's expert
        cache, copied to the GPU, on the CPU (None: not counted, or no pairs)."""
        t = self.traffic
        pairs = t and t["pairs_cached"] + t["pairs_copied"] + t["pairs_cpu"]
        return tuple(t[k] / pairs for k in ("pairs_cached", "pairs_copied", "pairs_cpu")) if pairs else None

    @property
    def bus_bytes_per_token(self) -> float | None:
        """Expert bytes that crossed the bus per token of the timed runs (None: not counted)."""
        t = self.traffic
        return t["bus_bytes"] / t["tokens"] if t and t["tokens"] else None


TRAFFIC_COUNTERS = ("pairs_cached", "pairs_copied", "pairs_cpu", "bus_bytes", "tokens")


def _traffic(engine) -> dict | None:
    """The engine's cumulative expert-traffic counters now (None: the engine counts none, or
    its model has no host-resident experts)."""
    read = getattr(engine, "expert_traffic", None)
    counters = read() if read is not None else None
    return None if counters is None else {k: getattr(counters, k) for k in TRAFFIC_COUNTERS}


def _add_traffic(total: dict | None, before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return total
    total = total or dict.fromkeys(TRAFFIC_COUNTERS, 0)
    return {k: total[k] + after[k] - before[k] for k in TRAFFIC_COUNTERS}


def decode_tokens(engine, tokens: list[int], seq_id: int = 0) -> None:
    """Decode `tokens`, one a step, each given by the host as llama-bench's tg gives
    `rand() % n_vocab`: a greedy step (the output matrix and the argmax on the GPU, 4 bytes read
    back) whose input is the host's token, not the last step's argmax."""
    for token in tokens:
        for _ in engine.greedy(token, seq_id, 1):
            pass


@dataclass
class DepthFill:
    """What run_test leaves in an engine's sequence 0 between tests given the same DepthFill: the
    first `held` tokens of the seeded depth stream (each depth is a prefix of a deeper one), with
    a recurrent state's snapshot at their end. A deeper test extends them; a shallower one starts
    from an empty cache (a recurrent state cannot be cut back)."""

    held: int = 0


def _to_depth(engine, depth: int, vocab: int, seed: int, fill: DepthFill | None) -> None:
    """Sequence 0 holds the depth stream's first `depth` tokens, a snapshot at their end: from
    fill's tokens where they are a prefix, else from an empty cache."""
    start = fill.held if fill is not None and 0 < fill.held <= depth else 0
    if start:
        engine.truncate(0, start)
    else:
        engine.reset()
    if depth > start:
        engine.eval(random_tokens(depth, vocab, seed + 1000)[start:])
    if depth:
        engine.snapshot(0)
    if fill is not None:
        fill.held = depth


def run_test(engine, test: BenchTest, repetitions: int, seed: int = 0, fill: DepthFill | None = None) -> BenchResult:
    """One warm-up, then `repetitions` timed runs, each from an empty KV cache or from the depth:
    that is filled once (untimed), and each later run starts from it again, the cells past it
    forgotten and a recurrent state rewound to its snapshot there (the same state, bit for bit,
    as filling it again, which took minutes at depth 32768). With `fill` the depth is left in
    the engine afterwards, and a deeper test after it only adds the tokens between (DepthFill);
    without, the engine is reset. Generation decodes a new random token each step, as
    llama-bench does, from another seeded sequence in the warm-up and in each repetition: a
    greedy chain would meet in the timed runs exactly the experts its warm-up brought into the
    expert cache. With expert-traffic counters (Engine.expert_traffic), `traffic` sums their
    change over the timed runs."""
    vocab = engine.model.cfg.vocab_size
    result = BenchResult(test)
    for rep in range(repetitions + 1):
        if test.n_depth and rep:
            engine.truncate(0, test.n_depth)
        else:
            _to_depth(engine, test.n_depth, vocab, seed, fill)
        prompt = random_tokens(test.n_prompt, vocab, seed + rep)
        generated = random_tokens(test.n_gen, vocab, seed + 2000 + rep)
        before = _traffic(engine)
        t0 = time.perf_counter_ns()
        if test.n_prompt:
            engine.eval(prompt)
        decode_tokens(engine, generated)
        elapsed = time.perf_counter_ns() - t0
        if rep:  # the first run warms up (records the command sequences)
            result.samples_ns.append(elapsed)
            result.traffic = _add_traffic(result.traffic, before, _traffic(engine))
    if fill is not None and test.n_depth:
        engine.truncate(0, test.n_depth)
    else:
        engine.reset()
        if fill is not None:
            fill.held = 0
    return result


COPY_SOURCE = """def parse_pairs(text: str) -> dict[str, int]:
    \"\"\"Key=value pairs, one a line, into a dict of ints.\"\"\"
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = int(value.strip())
    return out


def total(pairs: dict[str, int]) -> int:
    return sum(pairs.values())
"""


def copy_prompt(tokenizer) -> list[int]:
    """A prompt whose answer copies it: a short function and the request to repeat it with one
    name changed, where n-gram lookup and draft models find their drafts (coding agents re-emit
    their input the same way)."""
    text = (f"Here is a Python module:\n\n```python\n{COPY_SOURCE}```\n\nThe same module with `total` renamed "
            f"to `sum_values`:\n\n```python\n")
    return tokenizer.encode(text)


def run_copy_test(engine, test: BenchTest, repetitions: int, prompt: list[int], speculation=None) -> BenchResult:
    """A greedy generation of test.n_gen tokens after `prompt` (copy_prompt), timed from the
    prompt's end (its prefill is not counted), with `speculation()` (a fresh Speculation a run;
    None: plain decoding): one warm-up, then `repetitions` timed runs. End-of-text tokens do not
    stop it."""
    from .generate import generate
    from .sampler import GREEDY
    result = BenchResult(test)
    for rep in range(repetitions + 1):
        engine.reset()
        if test.n_depth:
            engine.eval(random_tokens(test.n_depth, engine.model.cfg.vocab_size, 1000 + rep))
        gen = generate(engine, prompt, test.n_gen, GREEDY,
                       speculation=speculation() if speculation is not None else None)
        if rep:
            result.samples_ns.append(int(gen.timings.predicted_ms * 1e6))
            result.drafted += gen.timings.draft_n
            result.accepted += gen.timings.draft_n_accepted
    engine.reset()
    return result
