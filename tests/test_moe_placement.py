"""MoE with experts in host memory: tokens identical for every --n-cpu-moe, prefetch slot count,
pinning and mmap choice, with decode experts staged in VRAM or read in place; slot allocation
failures fall back; --vram-budget planning."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from models import tiny_model
from vkrt.device import Device
from vkrt.engine.engine import Engine
from vkrt.engine.placement import DoesNotFit, estimate, plan_n_cpu_moe
from vkrt.engine.staging import expert_bytes
from vkrt.model.gguf_file import GGUFFile
from vkrt.model.loader import Model

PROMPT = list(range(3, 40, 2))   # 19 tokens: 19 x 2 routed >= 2 x 8 experts, so prefetch applies


@pytest.fixture(scope="module")
def moe_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    return {name: tiny_model(name, d) for name in ("tiny-qwen3moe", "tiny-qwen2moe")}


def greedy(device, path, *, n_cpu_moe=0, slots=None, pin=None, mmap=True, n=6, stage=None, staged=None,
           cache_slots=None):
    """Greedy tokens; cache_slots: experts per layer the decode cache may hold (None: automatic)."""
    with Model(device, path, mmap=mmap, n_cpu_moe=n_cpu_moe, pin=pin, progress=False) as m:
        cache = None if cache_slots is None else cache_slots * max(n_cpu_moe, 1) * expert_bytes(m)
        with Engine(m, n_ctx=128, n_ubatch=32, prefetch_slots=slots, stage_experts=stage, expert_cache=cache) as e:
            logits = e.eval(PROMPT)
            out = []
            for _ in range(n):
                out.append(int(np.argmax(logits)))
                logits = e.eval([out[-1]])
            if staged is not None:
                staged.append((e.staging.layers, e.staging.cache_slots))
                rate = e.staging.hit_rate()
                assert (rate is None) == (e.staging.cache_slots == 0)
                assert rate is None or 0 < rate < 1, rate   # 12 steps over 8 experts: some hit, the first miss
            return out, e.prefetch.n_slots, e.stats.layers_prefetched, m.placement


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-qwen2moe"])
def test_tokens_identical_across_placements(device, moe_paths, name):
    path = moe_paths[name]
    reference, *_ = greedy(device, path)
    for n_cpu_moe, slots, pin, mmap in itertools.product((0, 1, 2), (0, 2, 3), (True, False), (True, False)):
        tokens, n_slots, prefetched, placement = greedy(device, path, n_cpu_moe=n_cpu_moe, slots=slots, pin=pin,
                                                        mmap=mmap)
        assert tokens == reference, (n_cpu_moe, slots, pin, mmap)
        host_experts = [t for t in placement.host_tensors if "_exps." in t]
        assert len(host_experts) == 3 * n_cpu_moe
        if n_cpu_moe and slots:
            assert n_slots == slots and prefetched >= n_cpu_moe, "prefetch did not run"
        else:
            assert prefetched == 0
        if not pin:
            assert placement.host_imported == 0


# (stage_experts, expert cache slots per layer, expect staged layers, expect cache slots); the tiny
# models have 8 experts, 2 chosen per token, Q8_0 (a type read in place unless staging is forced)
DECODE_PATHS = [(False, None, False, 0),   # read in place, no cache
                (None, 0, False, 0),       # by type: Q8_0 is read in place
                (True, 0, True, 0),        # staged, no cache
                (True, 1, True, 1),        # cache smaller than one step's experts: overflow staged
                (True, 3, True, 3),        # least recently used experts replaced
                (None, None, True, 8)]     # automatic: every expert fits


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-qwen2moe"])
def test_decode_staging_and_cache(device, moe_paths, name):
    """Decode reads the chosen host experts in place, staged in VRAM slots, or through the
    per-layer expert cache of any size: the tokens never change."""
    path = moe_paths[name]
    reference, *_ = greedy(device, path, n=12)
    for (stage, cache, is_staged, want_cache), n_cpu_moe, pin in itertools.product(DECODE_PATHS, (1, 2), (True, False)):
        staged: list = []
        tokens, *_ = greedy(device, path, n_cpu_moe=n_cpu_moe, slots=0, pin=pin, stage=stage, staged=staged,
                            cache_slots=cache, n=12)
        assert tokens == reference, (stage, cache, n_cpu_moe, pin)
        assert staged == [(list(range(n_cpu_moe)) if is_staged else [], want_cache)], (stage, cache)


def test_slot_allocation_failure_falls_back(moe_paths):
    """Under a VRAM budget with room for 0, 1 or 2 slots next to the model, 3 requested slots
    become none, none (one slot is not enough) or 2; the tokens never change."""
    path = moe_paths["tiny-qwen3moe"]
    with Device() as dev:
        reference, *_ = greedy(dev, path, n_cpu_moe=2, slots=0)
        with Model(dev, path, n_cpu_moe=2, progress=False) as m, \
                Engine(m, n_ctx=128, n_ubatch=32, prefetch_slots=0, expert_cache=0) as e:
            need, slot = dev.vram_used, e.prefetch.slot_bytes
    assert slot > 0
    for room_for, expect in ((0, 0), (1, 0), (2, 2)):
        with Device(vram_budget=need + room_for * slot + slot // 2) as dev:
            tokens, n_slots, prefetched, _ = greedy(dev, path, n_cpu_moe=2, slots=3, cache_slots=0)
            assert n_slots == expect
            assert (prefetched > 0) == (expect > 0)
            assert tokens == reference


def test_vram_budget_planning(moe_paths):
    path = moe_paths["tiny-qwen3moe"]
    with GGUFFile(path, progress=False) as f:
        from vkrt.model.config import ModelConfig
        cfg = ModelConfig.from_metadata(f.metadata)
        kw = dict(n_ctx=128, n_ubatch=32)
        est = [estimate(cfg, f.tensors, n_cpu_moe=n, **kw) for n in range(3)]
        assert est[0].weights > est[1].weights > est[2].weights
        assert est[0].staging == 0 < est[1].staging == est[2].staging, "decode staging is counted"
        assert est[0].total > est[2].total
        for budget in (e.total for e in est):
            smallest = min(n for n in range(3) if est[n].total <= budget)
            assert plan_n_cpu_moe(cfg, f.tensors, budget, requested=None, **kw) == smallest
        with pytest.raises(DoesNotFit, match="--n-cpu-moe 2 would fit"):
            plan_n_cpu_moe(cfg, f.tensors, est[2].total, requested=0, **kw)
        with pytest.raises(DoesNotFit, match="lower -c or -ub"):
            plan_n_cpu_moe(cfg, f.tensors, est[2].total // 2, requested=None, **kw)


def test_max_context_is_the_longest_that_fits(moe_paths):
    """max_context: the longest context (a multiple of 256, at most the limit) whose estimate fits
    the budget, for each KV width; none when the weights alone overflow it."""
    from vkrt.engine.placement import CONTEXT_STEP, max_context
    path = moe_paths["tiny-qwen3moe"]
    with GGUFFile(path, progress=False) as f:
        from vkrt.model.config import ModelConfig
        cfg = ModelConfig.from_metadata(f.metadata)
        kw = dict(n_ubatch=32, n_cpu_moe=0)
        budget = estimate(cfg, f.tensors, n_ctx=1000 * CONTEXT_STEP, kv_bytes=1.0625, **kw).total
        for kv_bytes in (2.0, 1.0625, 0.5625):
            n = max_context(cfg, f.tensors, budget, limit=4000 * CONTEXT_STEP, kv_bytes=kv_bytes, **kw)
            assert n % CONTEXT_STEP == 0
            assert estimate(cfg, f.tensors, n_ctx=n, kv_bytes=kv_bytes, **kw).total <= budget
            assert estimate(cfg, f.tensors, n_ctx=n + CONTEXT_STEP, kv_bytes=kv_bytes, **kw).total > budget
            if kv_bytes == 1.0625:
                assert n == 1000 * CONTEXT_STEP
        assert max_context(cfg, f.tensors, budget, limit=300, kv_bytes=2.0, **kw) == 256   # the limit caps it
        weights = estimate(cfg, f.tensors, n_ctx=CONTEXT_STEP, kv_bytes=2.0, **kw).total
        assert max_context(cfg, f.tensors, weights - 1, limit=4096, kv_bytes=2.0, **kw) == 0
