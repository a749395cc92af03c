"""An agent loop on a model with a recurrent state (tiny qwen35moe) through /v1/chat/completions:
a thinking template that drops the reasoning of the turns before the last user message (as
Qwen3's does), tool calls and their results in the history. No turn reads the whole prompt again:
a tool turn resumes at the previous prompt's end, a new user message where the re-rendered
history first differs (the checkpoints kept there: vkrt/server/checkpoints.py); the cached tokens
reported are the tokens not read (prompt_n = prompt_tokens - cached), and the replies equal a
cold run's."""

from __future__ import annotations

import dataclasses
import json

import pytest
from models import TINY

from vkrt.model.synthetic import write_model

from .serverproc import serving, wait_idle

# Qwen3's chat template, in short: tools in the system turn, reasoning kept only for the turns
# after the last real user message, tool results as user turns
THINKING = """{%- if tools %}<|im_start|>system
# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools><|im_end|>
{% endif %}
{%- set ns = namespace(last_query=messages|length - 1, multi_step=true) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step and message.role == "user" %}
{%- set ns.multi_step = false %}{% set ns.last_query = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == "assistant" %}<|im_start|>assistant
{% if loop.index0 > ns.last_query and message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>

{% endif %}{{ message.content or "" }}
{%- for tc in message.tool_calls or [] %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>tool
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the project",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def call(k: int, path: str) -> dict:
    return {"role": "assistant", "content": "", "reasoning_content": f"I should look at {path} first, step {k}.",
            "tool_calls": [{"id": f"call_{k}", "type": "function",
                            "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}]}


def result(k: int, text: str) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{k}", "content": text}


# each turn: the messages added before it is sent (a user message starts a new query)
TURNS = [
    [{"role": "user", "content": "Find where the scheduler admits a job and explain it."}],
    [call(1, "vkrt/server/scheduler.py"), result(1, "def _admit(self, engine): picks the idle slot holding the most")],
    [call(2, "vkrt/server/slots.py"), result(2, "class Slot: one KV-cache sequence and the tokens it holds")],
    [{"role": "assistant", "content": "The scheduler picks the slot holding the longest prefix.",
      "reasoning_content": "Both files read; answer now."},
     {"role": "user", "content": "And how are recurrent states resumed?"}],
    [call(3, "vkrt/server/checkpoints.py"), result(3, "class SlotCheckpoints: a few checkpoints per slot")],
    [{"role": "assistant", "content": "From the longest checkpoint inside the shared prefix.",
      "reasoning_content": "Enough."},
     {"role": "user", "content": "Thanks. Summarise both answers in one line."}],
]


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("agent-loop") / "tiny-qwen35moe-thinking.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen35moe"], chat_template=THINKING))
    yield from serving(path, "-c", "2048", "-np", "2", "-b", "256", "-ub", "64")


def tokens(srv, messages) -> list[int]:
    status, reply = srv.post("/apply-template", {"messages": messages, "tools": TOOLS})
    assert status == 200, reply
    status, reply = srv.post("/tokenize", {"content": reply["prompt"]})
    assert status == 200, reply
    return reply["tokens"]


def ask(srv, messages, cache: bool = True) -> dict:
    body = {"messages": messages, "tools": TOOLS, "temperature": 0, "max_tokens": 6, "cache_prompt": cache,
            "id_slot": 0}
    status, reply = srv.post("/v1/chat/completions", body)
    assert status == 200, reply
    wait_idle(srv)
    return reply


def shared(a: list[int], b: list[int]) -> int:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n


def test_no_turn_reads_the_whole_prompt_again(agent_server):
    messages, previous, replies = [], None, []
    for k, added in enumerate(TURNS):
        messages = messages + added
        prompt = tokens(agent_server, messages)
        reply = ask(agent_server, messages)
        usage, timings = reply["usage"], reply["timings"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert usage["prompt_tokens"] == len(prompt)
        assert timings["cache_n"] == cached and timings["prompt_n"] == len(prompt) - cached, (k, usage, timings)
        if previous is None:
            assert cached == 0
        elif added[-1]["role"] == "tool":   # the loop goes on: the previous prompt extends
            assert shared(prompt, previous) == len(previous)
            assert cached >= len(previous), (k, cached, len(previous))
        else:   # a new query: the reasoning since the last one is gone from the history
            common = shared(prompt, previous)
            assert common < len(previous)
            assert common - 4 <= cached <= common, (k, cached, common)
        replies.append(reply["choices"][0]["message"])
        previous = prompt
    cold = ask(agent_server, messages, cache=False)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cold["choices"][0]["message"] == replies[-1]
