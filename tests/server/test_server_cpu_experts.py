"""`vkrt serve` with every expert in host memory computed on the CPU (--cpu-experts all): a
batched decode step of several slots goes through the host's plan, each client gets the text it
gets alone, and /props carries the box's measured rates."""

from __future__ import annotations

import json

import pytest
from models import tiny_model

from .serverproc import metric, serving, wait_idle
from .test_server_concurrency import _run


@pytest.fixture(scope="module")
def cpu_server(tmp_path_factory):
    path = tiny_model("tiny-qwen3moe", tmp_path_factory.mktemp("cpu-experts-server"))
    yield from serving(path, "-c", "1024", "-np", "3", "-b", "256", "-ub", "64", "-ncmoe", "99",
                       "--cpu-experts", "all", "--expert-cache", "0", "--cpu-moe-threads", "2")


def test_batched_steps_on_the_cpu_give_each_client_its_text(cpu_server):
    prompts = ["Once upon a time there was a fox", "Once upon a time there was a dog", "The capital of France"]
    wait_idle(cpu_server)
    alone = _run(cpu_server, prompts, 12, concurrent=False)
    steps0, seqs0 = metric(cpu_server, "vkrt_n_decode_total"), metric(cpu_server, "vkrt_n_decode_sequences_total")
    together = _run(cpu_server, prompts, 12, concurrent=True)
    assert together == alone and len(set(alone)) > 1
    steps = metric(cpu_server, "vkrt_n_decode_total") - steps0
    assert steps < metric(cpu_server, "vkrt_n_decode_sequences_total") - seqs0   # slots shared steps
    wait_idle(cpu_server)


def test_props_carry_the_box(cpu_server):
    status, raw = cpu_server.get("/props")
    assert status == 200
    box = json.loads(raw)["box"]
    assert box["h2d_gbps"] is None or box["h2d_gbps"] > 0
    assert box["cpu_gbps"]["Q8_0"]   # the model's expert type, measured at start
