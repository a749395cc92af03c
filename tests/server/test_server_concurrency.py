"""Several clients at once: each gets the text it gets alone, decode steps are batched across
slots, requests beyond the slots queue, and a client that disconnects frees its slot."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from .serverproc import metric, wait_idle

PROMPTS = [f"Once upon a time there was {w}" for w in
           ("a fox", "a dog", "one model", "the world", "a small count", "Paris", "a lazy dog", "weather today")]


async def _stream_text(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    parts = []
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            line = line.decode().strip()
            if line == "data: [DONE]":
                break
            if line.startswith("data: "):
                parts.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(parts)


def _run(server, prompts, max_tokens, concurrent: bool) -> list[str]:
    async def main():
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(headers=server.headers(), timeout=timeout) as session:
            if concurrent:
                return await asyncio.gather(*(_stream_text(session, server.url, p, max_tokens) for p in prompts))
            return [await _stream_text(session, server.url, p, max_tokens) for p in prompts]
    return asyncio.run(main())


def test_eight_concurrent_clients_get_their_own_text(server):
    wait_idle(server)
    alone = _run(server, PROMPTS, 24, concurrent=False)
    steps0, seqs0 = metric(server, "vkrt_n_decode_total"), metric(server, "vkrt_n_decode_sequences_total")
    together = _run(server, PROMPTS, 24, concurrent=True)
    assert together == alone
    assert len(set(alone)) > 1  # the prompts lead to different texts, so a mix-up would show
    steps = metric(server, "vkrt_n_decode_total") - steps0
    seqs = metric(server, "vkrt_n_decode_sequences_total") - seqs0
    assert seqs == 8 * 23  # every token after the first comes from a decode step
    assert steps < seqs / 2, "decode steps were not batched across slots"
    assert all(not s["is_processing"] for s in wait_idle(server))


def test_disconnect_mid_stream_frees_the_slot(server):
    wait_idle(server)
    cancelled0 = metric(server, "vkrt_requests_cancelled_total")

    async def main():
        body = {"prompt": "Hello", "max_tokens": 250, "temperature": 0, "stream": True, "ignore_eos": True}
        async with aiohttp.ClientSession(headers=server.headers()) as session:
            resp = await session.post(server.url + "/v1/completions", json=body)
            seen = 0
            async for line in resp.content:
                seen += line.startswith(b"data: ")
                if seen == 3:
                    break
            resp.close()  # drop the connection mid-stream
        return seen

    assert asyncio.run(main()) == 3
    slots = wait_idle(server)
    assert all(not s["is_processing"] for s in slots), slots
    assert metric(server, "vkrt_requests_cancelled_total") == cancelled0 + 1
    assert max(s["n_decoded"] for s in slots) < 250
    # the slot serves the next request
    status, out = server.post("/completion", {"prompt": "Hello", "n_predict": 3, "temperature": 0})
    assert status == 200 and out["tokens_predicted"] <= 3


def test_requests_beyond_the_slots_queue_and_can_leave(server):
    wait_idle(server)
    cancelled0 = metric(server, "vkrt_requests_cancelled_total")

    async def until(name, value):
        for _ in range(400):
            if metric(server, name) == value:
                return True
            await asyncio.sleep(0.05)
        return False

    async def main():
        long = {"prompt": "Hello", "max_tokens": 250, "temperature": 0, "stream": True, "ignore_eos": True}
        async with aiohttp.ClientSession(headers=server.headers()) as session:
            streams = [await session.post(server.url + "/v1/completions", json=long) for _ in range(4)]
            for r in streams:
                await r.content.readline()  # each holds a slot now
            queued = asyncio.ensure_future(session.post(server.url + "/v1/completions",
                                                        json={"prompt": "Hi", "max_tokens": 4}))
            waited = await until("vkrt_requests_deferred", 1)
            queued.cancel()  # the client gives up while waiting for a slot
            left = await until("vkrt_requests_deferred", 0)
            for r in streams:
                r.close()
        return waited, left

    assert asyncio.run(main()) == (True, True)
    assert all(not s["is_processing"] for s in wait_idle(server))
    assert metric(server, "vkrt_requests_cancelled_total") == cancelled0 + 5
