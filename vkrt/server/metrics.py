"""Server counters and gauges, rendered in the Prometheus text exposition format (version 0.0.4).
Written by the scheduler thread, read by /metrics; plain numbers, so no lock is needed."""

from __future__ import annotations

from dataclasses import dataclass

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name -> (type, help)
_DOC = {
    "prompt_tokens_total": ("counter", "Prompt tokens evaluated (cached prefix tokens not included)."),
    "prompt_seconds_total": ("counter", "Seconds spent evaluating prompt tokens."),
    "prompt_tokens_cached_total": ("counter", "Prompt tokens reused from a slot's KV cache (cache_prompt)."),
    "tokens_predicted_total": ("counter", "Tokens generated."),
    "tokens_predicted_seconds_total": ("counter", "Seconds spent in decode steps (all slots of a step together)."),
    "n_decode_total": ("counter", "Decode steps run."),
    "n_decode_sequences_total": ("counter", "Sequences summed over decode steps (over n_decode_total: mean batch)."),
    "draft_tokens_total": ("counter", "Draft tokens speculative decoding verified."),
    "draft_tokens_accepted_total": ("counter", "Draft tokens verification accepted."),
    "requests_total": ("counter", "Generation requests accepted."),
    "requests_finished_total": ("counter", "Generation requests that ran to their end."),
    "requests_cancelled_total": ("counter", "Generation requests cancelled (client gone or shutdown)."),
    "requests_failed_total": ("counter", "Generation requests that failed in the engine."),
    "bad_requests_total": ("counter", "Requests answered with a 4xx status."),
    "requests_processing": ("gauge", "Requests holding a slot."),
    "requests_deferred": ("gauge", "Requests waiting for a slot."),
    "kv_cache_tokens": ("gauge", "Tokens held in the KV cache by all slots."),
    "kv_cache_usage_ratio": ("gauge", "KV cache cells in use over all cells."),
    "slots": ("gauge", "Slots (--parallel)."),
    "engine_steps_total": ("counter", "Forward passes the engine ran (prompt chunks and decode steps)."),
    "engine_step_seconds_total": ("counter", "Seconds the scheduler spent in forward passes (GPU waits included)."),
    "engine_gpu_wait_seconds_total": ("counter", "Of those, seconds spent waiting for the GPU."),
    "engine_graphs_recorded_total": ("counter", "Command graphs recorded (a step shape not in the graph cache)."),
    "engine_graph_record_seconds_total": ("counter", "Seconds spent recording them."),
}

# the same values under vLLM's names, which routers scrape (vLLM production-stack's vllm-router,
# the Gateway API inference extension): name -> (type, help, our name or a function of the values)
_VLLM = {
    "vllm:num_requests_running": ("gauge", "Requests holding a slot (= requests_processing).", "requests_processing"),
    "vllm:num_requests_waiting": ("gauge", "Requests waiting for a slot (= requests_deferred).", "requests_deferred"),
    "vllm:gpu_cache_usage_perc": ("gauge", "KV cache usage, 1 = full (= kv_cache_usage_ratio).",
                                  "kv_cache_usage_ratio"),
    "vllm:kv_cache_usage_perc": ("gauge", "KV cache usage, 1 = full (= kv_cache_usage_ratio).",
                                 "kv_cache_usage_ratio"),
    "vllm:gpu_prefix_cache_queries_total": ("counter", "Prompt tokens looked up in the slots' cached prefixes.",
                                            lambda v: v["prompt_tokens_total"] + v["prompt_tokens_cached_total"]),
    "vllm:gpu_prefix_cache_hits_total": ("counter", "Prompt tokens found there (= prompt_tokens_cached_total).",
                                         "prompt_tokens_cached_total"),
}


@dataclass
class Metrics:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    prompt_tokens_cached: int = 0
    tokens_predicted: int = 0
    decode_seconds: float = 0.0
    n_decode: int = 0
    n_decode_sequences: int = 0
    draft_tokens: int = 0
    draft_tokens_accepted: int = 0
    requests: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    bad_requests: int = 0

    def add_prompt(self, n: int, seconds: float) -> None:
        self.prompt_tokens += n
        self.prompt_seconds += seconds

    def add_decode(self, n_sequences: int, seconds: float) -> None:
        self.n_decode += 1
        self.n_decode_sequences += n_sequences
        self.decode_seconds += seconds

    def add_draft(self, drafted: int, accepted: int) -> None:
        self.draft_tokens += drafted
        self.draft_tokens_accepted += accepted

    def render(self, *, processing: int = 0, deferred: int = 0, kv_tokens: int = 0, kv_cells: int = 0,
               slots: int = 0, engine_stats=None, prefix: str = "vkrt") -> str:
        """The page; gauges are passed in, as the scheduler sees them now, and the engine's
        StepStats (`engine_stats`) when there is an engine."""
        values = {
            "prompt_tokens_total": self.prompt_tokens, "prompt_seconds_total": self.prompt_seconds,
            "prompt_tokens_cached_total": self.prompt_tokens_cached,
            "tokens_predicted_total": self.tokens_predicted, "tokens_predicted_seconds_total": self.decode_seconds,
            "n_decode_total": self.n_decode, "n_decode_sequences_total": self.n_decode_sequences,
            "draft_tokens_total": self.draft_tokens, "draft_tokens_accepted_total": self.draft_tokens_accepted,
            "requests_total": self.requests, "requests_finished_total": self.requests_finished,
            "requests_cancelled_total": self.requests_cancelled, "requests_failed_total": self.requests_failed,
            "bad_requests_total": self.bad_requests,
            "requests_processing": processing, "requests_deferred": deferred,
            "kv_cache_tokens": kv_tokens, "kv_cache_usage_ratio": kv_tokens / kv_cells if kv_cells else 0.0,
            "slots": slots,
        }
        if engine_stats is not None:
            e = engine_stats
            values.update({"engine_steps_total": e.steps, "engine_step_seconds_total": e.seconds,
                           "engine_gpu_wait_seconds_total": e.gpu_wait_seconds,
                           "engine_graphs_recorded_total": e.graphs_recorded,
                           "engine_graph_record_seconds_total": e.record_seconds})
        lines = []
        for name, value in values.items():
            kind, doc = _DOC[name]
            lines += [f"# HELP {prefix}_{name} {doc}", f"# TYPE {prefix}_{name} {kind}", f"{prefix}_{name} {value}"]
        for name, (kind, doc, source) in _VLLM.items():
            value = source(values) if callable(source) else values[source]
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, float]:
    """Sample name -> value of a Prometheus text page without labels (for tests and the load bench)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
