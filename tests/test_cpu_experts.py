"""Hybrid decode of host-resident experts (vkrt/engine/host_experts.py, `--cpu-experts`): the
host plans each step's experts, the CPU computes the uncached ones (all) or the share the rates
give it (auto); greedy tokens equal the GPU-only path's and llama.cpp's recorded ones; the
expert cache admits copied experts; --link-bandwidth paces the copies."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine.box_rates import BoxRates
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.expert_plan import copies, copy_share, hybrid_pays
from vkrt.engine.host_experts import HostExperts
from vkrt.engine.staging import expert_bytes, staged_layers
from vkrt.engine.sampler import GREEDY
from vkrt.model.loader import Model

PROMPTS = [list(range(5, 40, 3)), [7, 200, 12, 99, 4]]
STEPS = 8   # decode steps compared with llama.cpp: past them the q8 noise compounds through the KV cache
MOE = ["tiny-qwen3moe", "tiny-qwen35moe", "tiny-gpt-oss", "tiny-mixtral", "tiny-mxfp4-moe"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cpu-experts")


def greedy(device, path, n=6, **kw):
    """Greedy tokens after each prompt, every MoE layer's experts on host, and the engine's traffic."""
    with Model(device, path, n_cpu_moe=99, progress=False) as m, \
            Engine(m, n_ctx=128, n_ubatch=32, **kw) as e:
        out = []
        for prompt in PROMPTS:
            e.reset()
            out.append(generate(e, prompt, n, GREEDY).tokens)
        return out, e.expert_traffic(), e.stages[0].host_experts


def agrees(device, path, gpu_tokens, n=6, **kw):
    """Feed the GPU-only path's greedy tokens to an engine with `kw` (teacher forcing) and check
    that each step's best token is the GPU's, or a near tie of it (the q8 activations of the CPU
    kernels move logits by ~1 %: a tie within 1.5 % of the best logit, or 0.1, may flip); returns
    the engine's traffic and host experts."""
    with Model(device, path, n_cpu_moe=99, progress=False) as m, \
            Engine(m, n_ctx=128, n_ubatch=32, **kw) as e:
        for prompt, tokens in zip(PROMPTS, gpu_tokens):
            e.reset()
            logits = e.eval(prompt)
            for i, tok in enumerate(tokens):
                best = int(np.argmax(logits))
                tie = max(0.1, 0.015 * abs(float(logits[best])))
                assert best == tok or logits[best] - logits[tok] < tie, (prompt, i, best, tok, logits[best] - logits[tok])
                logits = e.eval([tok])
        return e.expert_traffic(), e.stages[0].host_experts


@pytest.mark.parametrize("name", MOE)
def test_cpu_experts_give_the_gpu_tokens(device, tiny_dir, name):
    path = tiny_model(name, tiny_dir)
    gpu, none, _ = greedy(device, path, cpu_experts="off")
    assert none is None
    traffic, host = agrees(device, path, gpu, cpu_experts="all", expert_cache=0)
    layers = len(host.expert_bytes)   # the engine is closed: its staging forgot its layers
    k = host.model.cfg.n_expert_used
    # every decode step's pairs ran on the CPU (prompts of more tokens may be prefetched instead)
    assert traffic.pairs_cpu >= layers * k * 6 * len(PROMPTS) and traffic.pairs_copied == traffic.bus_bytes == 0
    assert traffic.pairs_cpu == layers * k * traffic.tokens


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-mixtral", "tiny-gpt-oss", "tiny-qwen2moe"])
def test_cpu_experts_match_llama_cpp(device, tiny_dir, name):
    """Every expert on the CPU, fed llama.cpp's greedy continuations one decode step at a time
    (the first STEPS of each):
    the log-probabilities of llama.cpp's top 10 agree on average to 0.1 and everywhere to 0.5,
    and its token is our best or near it. (The q8 activations of the CPU kernels, as llama.cpp's
    CPU backend has them, move these random-weight models' expert outputs by ~1-2 %; the
    recorded answers are llama.cpp's Vulkan backend's. tiny-qwen35moe is left out: its random
    DeltaNet recurrences amplify that into logits 10 apart within a few steps -- the GPU path
    meets its llama.cpp answers exactly, test_model_reference.py.)"""
    ref = json.loads((Path(__file__).parent / "data" / "llama_reference.json").read_text())[f"{name}.gguf"]
    path = tiny_model(name, tiny_dir)
    with Model(device, path, n_cpu_moe=99, progress=False) as m, \
            Engine(m, n_ctx=512, n_ubatch=32, cpu_experts="all", expert_cache=0) as e:
        diffs, gaps = [], []
        for comp in ref["completions"]:
            if "extends" in comp or not comp["tokens"]:
                continue
            e.reset()
            logits = e.eval(comp["prompt_tokens"])
            for tok, tops in list(zip(comp["tokens"], comp["top_logprobs"]))[:STEPS]:
                lp = logits.astype(np.float64) - np.logaddexp.reduce(logits.astype(np.float64))
                gaps.append(lp.max() - lp[tok])
                diffs.append(np.abs(lp[[t for t, _ in tops]] - np.array([v for _, v in tops])))
                logits = e.eval([tok])
        assert e.expert_traffic().pairs_cpu > 0
    diffs = np.concatenate(diffs)
    assert diffs.mean() < 0.1 and diffs.max() < 0.5 and max(gaps) < 0.5, (diffs.mean(), diffs.max(), max(gaps))
    assert np.mean(np.array(gaps) == 0) > 0.8   # llama.cpp's token is ours at most steps


def Rates(link: float, cpu: float) -> BoxRates:
    """A box whose link copies `link` GB/s and whose CPU expert kernels read `cpu` GB/s."""
    return BoxRates(cpu="test", cores=1, device="test", measured="today", h2d_gbps=link, h2d_path="test",
                    ram_gbps=cpu, cpu_gbps={"Q8_0": {1: cpu}})


def test_auto_splits_copies_and_cpu_and_admits_to_the_cache(device, tiny_dir, monkeypatch):
    # tiny experts: rates slow enough that splitting pays for the host step
    monkeypatch.setattr("vkrt.engine.box_rates.box_rates", lambda *a, **k: Rates(1e-4, 1e-4))
    path = tiny_model("tiny-qwen3moe", tiny_dir)
    gpu, _, _ = greedy(device, path, cpu_experts="off")
    with Model(device, path, n_cpu_moe=99, progress=False) as m:
        room = 3 * expert_bytes(m) * len(staged_layers(m))   # 3 of the 8 experts of each layer
    traffic, host = agrees(device, path, gpu, cpu_experts="auto", cpu_moe_threads=1, expert_cache=room)
    assert host.staging.cache_slots == 3
    assert traffic.pairs_copied and traffic.pairs_cpu and traffic.pairs_cached   # copied experts hit later
    one = next(iter(host.expert_bytes.values()))
    assert traffic.bus_bytes and traffic.bus_bytes % one == 0   # whole experts crossed the link


def test_auto_leaves_a_link_faster_than_the_cpu_to_the_gpu(device, tiny_dir, monkeypatch):
    monkeypatch.setattr("vkrt.engine.box_rates.box_rates", lambda *a, **k: Rates(50.0, 1.0))
    path = tiny_model("tiny-qwen3moe", tiny_dir)
    _, traffic, host = greedy(device, path, n=2, cpu_experts="auto")
    assert traffic is None and host is None


def test_copies_balance_the_link_and_the_cpu():
    share = copy_share("auto", 12.0, 36.0)
    assert share == 0.25 and copies(8, share) == 2 and copies(8, copy_share("auto", 1.0, 36.0)) == 0
    assert copies(8, copy_share("auto", 50.0, 1.0)) == 8 and copies(8, copy_share("auto", None, 5.0)) == 4
    assert copies(8, copy_share("all", 50.0, 1.0)) == 0 and copies(5, copy_share("off", 1.0, 50.0)) == 5
    assert copies(0, 0.5) == 0 and copy_share("auto", 1.0, 50.0, cache_fits_all=True) == 1.0


def test_hybrid_pays_where_the_split_beats_the_host_step():
    b = 3 * 2048 * 512 * 144 // 256   # a Qwen3.5-35B-A3B Q4_K expert, 1.7 MB
    assert not hybrid_pays(8, b, 48.0, 29.0)   # the H100 box's own link: copying all is as fast
    assert hybrid_pays(8, b, 12.0, 29.0) and hybrid_pays(8, b, 1.0, 29.0)


def test_link_bandwidth_paces_the_copies(device, tiny_dir, monkeypatch):
    monkeypatch.setattr("vkrt.engine.box_rates.box_rates", lambda *a, **k: Rates(10.0, 1e-6))  # copy everything
    path = tiny_model("tiny-qwen3moe", tiny_dir)
    with Model(device, path, n_cpu_moe=99, progress=False) as m, \
            Engine(m, n_ctx=128, n_ubatch=32, cpu_experts="auto", expert_cache=0, link_bandwidth=0.002) as e:
        e.eval(PROMPTS[0])
        before = e.expert_traffic().bus_bytes
        t0 = time.perf_counter()
        for tok in (5, 9, 11):
            e.eval([tok])
        seconds = time.perf_counter() - t0
        moved = e.expert_traffic().bus_bytes - before
    assert moved > 0 and seconds >= moved / 0.002e9 * 0.95


def test_types_the_cpu_does_not_take_stay_on_the_gpu(device, tiny_dir, caplog):
    path = tiny_model("tiny-qwen35moe-f16", tiny_dir)
    with caplog.at_level("WARNING", logger="vkrt"):
        _, traffic, host = greedy(device, path, n=2, cpu_experts="all")
    assert traffic is None and host is None
    assert "F16, a type the CPU expert kernels do not take" in caplog.text


def test_host_experts_close_idempotently(device, tiny_dir):
    path = tiny_model("tiny-qwen3moe", tiny_dir)
    with Model(device, path, n_cpu_moe=99, progress=False) as m, Engine(m, n_ctx=64, cpu_experts="all") as e:
        host = e.stages[0].host_experts
        assert isinstance(host, HostExperts)
        logits = e.eval([3, 4])
        assert np.isfinite(logits).all()
    host.close()
    host.close()


@pytest.mark.parametrize("cached", [False, True])
def test_prompt_steps_take_the_host_plan_where_the_rates_say(device, tiny_dir, monkeypatch, cached):
    """A 40-token prompt (more than mv_max_n and mv_id_max_n) over a slow link: its experts run on the CPU (and
    the copies the plan allows) instead of streaming every expert; the logits stay the GPU's.
    With an expert cache the slot views are wider than the layer's experts (every later layer's
    cache slots, then the staging slots): the step counts its pairs in a table that wide."""
    monkeypatch.setattr("vkrt.engine.box_rates.box_rates", lambda *a, **k: Rates(1e-4, 10.0))
    path = tiny_model("tiny-qwen3moe", tiny_dir)
    prompt = [(7 * i) % 250 + 3 for i in range(40)]
    with Model(device, path, n_cpu_moe=99, progress=False) as m:
        assert len(prompt) > max(device.tuning.mv_max_n, device.tuning.mv_id_max_n)
        with Engine(m, n_ctx=128, n_ubatch=64, cpu_experts="off") as e:
            gpu = e.eval(prompt)
        room = 3 * expert_bytes(m) * len(staged_layers(m)) if cached else 0
        with Engine(m, n_ctx=128, n_ubatch=64, cpu_experts="all", expert_cache=room) as e:
            assert e.stages[0].host_experts.takes_prompt(len(prompt), True)
            assert (e.staging.cache_slots > 0) == cached
            cpu = e.eval(prompt)
            assert e.expert_traffic().pairs_cpu == len(prompt) * m.cfg.n_expert_used * len(e.staging.layers)
    assert int(np.argmax(cpu)) == int(np.argmax(gpu)) or gpu.max() - gpu[int(np.argmax(cpu))] < 0.1
    assert np.abs(cpu - gpu).max() < 0.05 * np.abs(gpu).max()


def test_paced_link_paces_prompt_uploads(device, tiny_dir):
    """--cpu-experts off with a paced link: a prompt that streams every layer's experts takes at
    least the layers' bytes over the link's rate."""
    path = tiny_model("tiny-qwen3moe", tiny_dir)
    with Model(device, path, n_cpu_moe=99, progress=False) as m, \
            Engine(m, n_ctx=128, n_ubatch=32, cpu_experts="off", link_bandwidth=0.001) as e:
        st = e.stages[0]
        if not st.prefetch.active:
            pytest.skip("no expert prefetch on this device")
        tokens = list(range(3, 3 + 32))
        assert not st.host_experts.takes_prompt(len(tokens), True)
        t0 = time.perf_counter()
        e.eval(tokens)
        seconds = time.perf_counter() - t0
    assert seconds >= len(st.prefetch.layers) * st.prefetch.slot_bytes / 1e6 * 0.95


def test_flags_with_nothing_to_do_are_named(device, tiny_dir, caplog):
    """--cpu-moe-threads with the CPU computing nothing, or the CPU flags on a model with every
    expert in VRAM: a warning names them (never silently ignored)."""
    path = tiny_model("tiny-qwen3moe", tiny_dir)
    with caplog.at_level("WARNING", logger="vkrt"):
        with Model(device, path, n_cpu_moe=99, progress=False) as m, \
                Engine(m, n_ctx=64, cpu_experts="off", cpu_moe_threads=2):
            pass
        assert "--cpu-moe-threads 2: with --cpu-experts off the CPU computes no expert" in caplog.text
        caplog.clear()
        with Model(device, path, progress=False) as m, \
                Engine(m, n_ctx=64, cpu_experts="all", link_bandwidth=3.0) as e:
            assert e.expert_traffic() is None
        assert "--link-bandwidth, --cpu-experts all: tiny-qwen3moe.gguf keeps no expert in host memory" in caplog.text
