"""gpt-oss's harmony chat template in the server's sandboxed Jinja: the Jinja it leans on
(macros, namespace(), slices of the messages, `in` on a message, raise_exception,
strftime_now, tojson), and the real template where a copy is at hand."""

from datetime import datetime
from pathlib import Path

import pytest

from vkrt.server.chat_template import ChatTemplate, TemplateError
from vkrt.settings import read_variable

# the real template (llama.cpp's models/templates/openai-gpt-oss-120b.jinja, as in gpt-oss GGUFs):
# VKRT_GPT_OSS_TEMPLATE, or shared/templates/ beside the checkout
REAL = [Path(p) for p in (read_variable("VKRT_GPT_OSS_TEMPLATE") or "",
                          Path(__file__).resolve().parents[3] / "shared" / "templates" / "openai-gpt-oss-120b.jinja")
        if p and Path(p).is_file()]

# written for this test in harmony's shape, with the constructs the real template uses
HARMONY = """
{%- macro system_message(effort="medium") -%}
    {{- "<|start|>system<|message|>Knowledge cutoff: 2024-06\\nCurrent date: " + strftime_now("%Y-%m-%d") }}
    {{- "\\n\\nReasoning: " + effort + "<|end|>" }}
{%- endmacro -%}
{{- system_message(reasoning_effort if reasoning_effort is defined else "medium") }}
{%- if messages[0].role == "system" %}
    {%- set developer = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set developer = "" %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if developer %}
    {{- "<|start|>developer<|message|># Instructions\\n\\n" + developer + "\\n\\n<|end|>" }}
{%- endif %}
{%- set last = namespace(name=none) %}
{%- for message in loop_messages -%}
    {%- if message.role == "assistant" -%}
        {%- if "thinking" in message and "<|channel|>" in message.thinking %}
            {{- raise_exception("pass analysis in the thinking field without channel tags") }}
        {%- endif %}
        {%- set later = namespace(final=false) %}
        {%- for m in loop_messages[loop.index:] %}
            {%- if m.role == "assistant" %}{%- set later.final = true %}{%- endif %}
        {%- endfor %}
        {%- if "tool_calls" in message %}
            {%- set call = message.tool_calls[0].function %}
            {{- "<|start|>assistant to=functions." + call.name + "<|channel|>commentary json<|message|>" }}
            {{- call.arguments|tojson + "<|call|>" }}
            {%- set last.name = call.name %}
        {%- else %}
            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }}
        {%- endif %}
    {%- elif message.role == "tool" -%}
        {{- "<|start|>functions." + last.name + " to=assistant<|channel|>commentary<|message|>" }}
        {{- message.content|tojson + "<|end|>" }}
    {%- elif message.role == "user" -%}
        {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|start|>assistant
{%- endif -%}
"""

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!", "thinking": "a greeting"}, {"role": "user", "content": "2+2?"}]


def today() -> str:
    return datetime.now().strftime("%Y-%m-%d")


def test_harmony_shaped_template_renders():
    t = ChatTemplate(HARMONY, "<|startoftext|>", "<|return|>")
    got = t.render(CHAT, add_generation_prompt=True, extra={"reasoning_effort": "high"})
    assert got == (f"<|start|>system<|message|>Knowledge cutoff: 2024-06\nCurrent date: {today()}\n\n"
                   "Reasoning: high<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
                   "<|start|>user<|message|>Hi there<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
                   "<|start|>user<|message|>2+2?<|end|><|start|>assistant")
    calls = CHAT + [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"}]
    assert t.render(calls, add_generation_prompt=False).endswith(
        '<|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
        '<|start|>functions.weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>')
    with pytest.raises(TemplateError, match="without channel tags"):
        t.render([{"role": "assistant", "content": "x", "thinking": "<|channel|>analysis"}])


@pytest.mark.skipif(not REAL, reason="the real gpt-oss template is not at hand (VKRT_GPT_OSS_TEMPLATE, "
                                     "shared/templates/openai-gpt-oss-120b.jinja)")
def test_real_gpt_oss_template_renders():
    t = ChatTemplate(REAL[0].read_text(), "<|startoftext|>", "<|return|>")
    got = t.render(CHAT, add_generation_prompt=True)
    assert got.startswith("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                          f"Knowledge cutoff: 2024-06\nCurrent date: {today()}\n\nReasoning: medium\n\n")
    assert got.endswith("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
                        "<|start|>user<|message|>Hi there<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
                        "<|end|><|start|>user<|message|>2+2?<|end|><|start|>assistant")
    assert "Reasoning: low" in t.render(CHAT, extra={"reasoning_effort": "low"})
    tools = [{"type": "function", "function": {"name": "weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "description": "City"}}, "required": ["city"]}}}]
    assert "type weather = (_: {\n// City\ncity: string,\n}) => any;" in t.render(CHAT, tools=tools)
    with pytest.raises(TemplateError, match="channel"):
        t.render([{"role": "assistant", "content": "<|channel|>final<|message|>x"}])
