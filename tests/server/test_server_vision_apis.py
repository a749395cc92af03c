"""Images through the Anthropic Messages API (base64 `image` blocks, in user turns and tool
results; count_tokens) and the OpenAI Responses API (`input_image` data URLs, kept for
previous_response_id), with the official clients on `vkrt serve --mmproj`: the same greedy answer
and prompt tokens as the same image through /v1/chat/completions; and the refusals, naming the field."""

from __future__ import annotations

import base64
import re

import anthropic
import openai
import pytest
from models import tiny_model

from vision_cases import TEXT_MODEL, image_png, mmproj_file

from .serverproc import API_KEY, serving, wait_idle

QUESTION = "What is this?"
N = 6                 # tokens each answer may have
IMAGE_TOKENS = 8 + 13 + 12   # the 64x128 image: 8 tokens, and its frame as text in the tiny vocabulary
GREEDY = {"temperature": 0}
PNG = image_png(64, 128, 1)
B64 = base64.b64encode(PNG).decode()
DATA_URL = "data:image/png;base64," + B64


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision-apis")
    model, mmproj = tiny_model(TEXT_MODEL, folder), mmproj_file(folder)
    yield from serving(model, "--mmproj", mmproj, "-c", "2048", "-np", "2", "-ub", "64", "--body-limit", str(1 << 20))


def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def ant(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


def image_block(**source) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64, **source}}


def prompt(usage) -> int:
    """An Anthropic usage's prompt tokens: those read, and those the prompt cache gave."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def chat(server, with_image: bool = True):
    """The chat answer to the image then QUESTION: (text with its reasoning, prompt tokens)."""
    parts = ([{"type": "image_url", "image_url": {"url": DATA_URL}}] if with_image else []) + \
        [{"type": "text", "text": QUESTION}]
    out = oai(server).chat.completions.create(model="x", max_tokens=N, temperature=0,
                                              messages=[{"role": "user", "content": parts}])
    wait_idle(server)
    msg = out.choices[0].message
    return (getattr(msg, "reasoning_content", None) or "") + (msg.content or ""), out.usage.prompt_tokens


def test_messages_image_answers_as_chat(vision_server):
    want, prompt_tokens = chat(vision_server)
    text_only = chat(vision_server, with_image=False)
    assert prompt_tokens == text_only[1] + IMAGE_TOKENS and want != text_only[0]   # the answer sees the image
    out = ant(vision_server).messages.create(
        model="x", max_tokens=N, extra_body=GREEDY,
        messages=[{"role": "user", "content": [image_block(), {"type": "text", "text": QUESTION}]}])
    wait_idle(vision_server)
    got = "".join(getattr(b, "thinking", None) or getattr(b, "text", "") for b in out.content)
    assert got == want and want
    assert prompt(out.usage) == prompt_tokens


def test_count_tokens_counts_the_image(vision_server):
    client = ant(vision_server)
    ask = [{"role": "user", "content": [image_block(), {"type": "text", "text": QUESTION}]}]
    n = client.messages.count_tokens(model="x", messages=ask).input_tokens
    text_only = client.messages.count_tokens(model="x", messages=[{"role": "user", "content": QUESTION}])
    assert n == text_only.input_tokens + IMAGE_TOKENS == chat(vision_server)[1]


def test_image_in_a_tool_result(vision_server):
    """A screenshot a tool returned: its tokens in the prompt, and the answer as generated."""
    client = ant(vision_server)
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]}
    tools = [{"name": "shot", "description": "A screenshot", "input_schema": {"type": "object"}}]

    def turn(content):
        return [{"role": "user", "content": "Look."}, call,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}]}]
    text = [{"type": "text", "text": "the screen"}]
    plain = client.messages.count_tokens(model="x", tools=tools, messages=turn(text)).input_tokens
    with_image = turn(text + [image_block()])
    assert client.messages.count_tokens(model="x", tools=tools, messages=with_image).input_tokens == \
        plain + IMAGE_TOKENS
    out = client.messages.create(model="x", max_tokens=N, tools=tools, messages=with_image, extra_body=GREEDY)
    wait_idle(vision_server)
    assert prompt(out.usage) == plain + IMAGE_TOKENS


def test_responses_image_answers_as_chat(vision_server):
    want, prompt_tokens = chat(vision_server)
    client = oai(vision_server)
    part = {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}
    out = client.responses.create(model="x", max_output_tokens=N, temperature=0, input=[
        {"role": "user", "content": [part, {"type": "input_text", "text": QUESTION}]}])
    wait_idle(vision_server)
    reasoning = "".join(c.text for item in out.output if item.type == "reasoning" for c in item.content or ())
    assert reasoning + out.output_text == want and want
    assert out.usage.input_tokens == prompt_tokens
    more = client.responses.create(model="x", max_output_tokens=2, temperature=0, previous_response_id=out.id,
                                   input="And now?")   # the kept conversation keeps its image
    wait_idle(vision_server)
    assert more.usage.input_tokens > prompt_tokens + out.usage.output_tokens


def _messages_error(server, content, counting: bool = False) -> str:
    client, ask = ant(server), [{"role": "user", "content": content}]
    with pytest.raises(anthropic.BadRequestError) as err:
        if counting:
            client.messages.count_tokens(model="x", messages=ask)
        else:
            client.messages.create(model="x", max_tokens=2, messages=ask)
    assert err.value.body["error"]["type"] == "invalid_request_error"
    return err.value.body["error"]["message"]


@pytest.mark.parametrize("block, field, why", [
    (image_block(type="url", url="https://example.com/a.png"), "messages[0].content[1].source.url",
     "--allow-image-urls"),
    (image_block(type="file", file_id="file_1"), "messages[0].content[1].source.type", "uploaded files"),
    (image_block(data="@@@"), "messages[0].content[1].source.data", "not valid base64"),
    (image_block(data="aGVsbG8="), "messages[0].content[1].source.data", "not an image vkrt decodes|corrupt"),
    (image_block(media_type="image/bmp"), "messages[0].content[1].source.media_type", "image/webp"),
    (image_block(media_type="text/plain"), "messages[0].content[1].source.media_type", "image/jpeg"),
    ({"type": "image"}, "messages[0].content[1].source", "base64"),
    ({"type": "document", "source": {}}, "messages[0].content[1].type", "no documents"),
])
def test_messages_image_refusals(vision_server, block, field, why):
    message = _messages_error(vision_server, [{"type": "text", "text": "hi"}, block])
    assert field in message and re.search(why, message), message


def test_messages_image_in_assistant_turn_refused(vision_server):
    client = ant(vision_server)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="x", max_tokens=2, messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": [image_block()]},
            {"role": "user", "content": "and?"}])
    assert "'messages[1].content[0].type'" in err.value.body["error"]["message"]


@pytest.mark.parametrize("part, field, why", [
    ({"type": "input_image", "file_id": "file_1"}, "input[0].content[1].file_id", "no uploaded files"),
    ({"type": "input_image", "image_url": "https://example.com/a.png"}, "input[0].content[1].image_url", "fetch"),
    ({"type": "input_image", "image_url": "data:image/png;base64,@@@"}, "input[0].content[1].image_url",
     "not valid base64"),
    ({"type": "input_image", "image_url": "data:text/plain;base64,aGVsbG8="}, "input[0].content[1].image_url",
     "holds 'text/plain'"),
    ({"type": "input_image", "image_url": DATA_URL, "detail": "ultra"}, "input[0].content[1].detail",
     "auto, low, high"),
    ({"type": "input_file", "file_id": "file_1"}, "input[0].content[1].type", "no files"),
])
def test_responses_image_refusals(vision_server, part, field, why):
    with pytest.raises(openai.BadRequestError) as err:
        oai(vision_server).responses.create(model="x", max_output_tokens=2, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}, part]}])
    body = err.value.body
    assert body["param"] == field and why in body["message"], body


def test_text_server_refuses_images(server):
    """The session's text-only server (no --mmproj): each API's 400 names the field and --mmproj."""
    message = _messages_error(server, [image_block()])
    assert "'messages[0].content[0].source.data'" in message and "--mmproj" in message
    message = _messages_error(server, [image_block()], counting=True)
    assert "'messages[0].content[0].source.data'" in message and "--mmproj" in message
    with pytest.raises(openai.BadRequestError) as err:
        oai(server).responses.create(model="x", max_output_tokens=2, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": DATA_URL}]}])
    assert err.value.body["param"] == "input[0].content[0].image_url" and "--mmproj" in err.value.body["message"]
