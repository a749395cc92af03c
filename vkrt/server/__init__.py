"""OpenAI- and llama-server-compatible HTTP serving: request validation, chat templates, a slot
scheduler with continuous batching and prompt-prefix reuse, SSE streaming, Prometheus metrics."""
