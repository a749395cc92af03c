"""Staging decode experts: the plan against numpy (with and without the per-layer LRU cache,
over several steps), the copy byte for byte, and mul_mat_id on the staged slots bit-identical
to mul_mat_id on the stack itself."""

import numpy as np
import pytest
from quant_data import random_blocks, weight_tensor
from test_mul_mat_id import run

from vkrt.commands import read_tensor, run_once, tensor_from_numpy, write_tensor
from vkrt.errors import UnsupportedShape
from vkrt.memory import I32, Tensor
from vkrt.ops.moe_stage import (cache_counts, cache_state_words, initial_cache_state, moe_stage_copy, moe_stage_plan, plan_words,
                                stage_unit)


def plan_reference(ids: np.ndarray, n_expert: int):
    valid = ids[(ids >= 0) & (ids < n_expert)]
    experts = np.unique(valid)
    slot = {int(e): s for s, e in enumerate(experts)}
    remap = np.array([[slot.get(int(e), -1) for e in row] for row in ids], np.int32)
    return experts, remap


def make_plan(device, ids_np, n_expert, stage_base=0):
    ids = tensor_from_numpy(device, ids_np)
    remap = Tensor.empty(device, I32, ids_np.shape[::-1])
    plan = Tensor.empty(device, I32, (plan_words(n_expert) + 3,))
    write_tensor(plan, np.full(plan_words(n_expert) + 3, 7777, np.int32))
    run_once(device, lambda seq: moe_stage_plan(seq, ids, remap, plan, n_expert, stage_base=stage_base))
    ids.close()
    return remap, plan


@pytest.mark.parametrize("n_tokens,n_used,n_expert", [(1, 2, 6), (3, 4, 16), (8, 8, 128), (5, 1, 3)])
def test_plan_matches_numpy(device, n_tokens, n_used, n_expert):
    rng = np.random.default_rng(n_tokens * 100 + n_expert)
    ids = np.stack([rng.choice(n_expert, n_used, replace=False) for _ in range(n_tokens)]).astype(np.int32)
    if n_tokens > 1:
        ids[-1, 0] = n_expert + 5   # out of range: remapped to -1, never staged
    experts, remap_ref = plan_reference(ids, n_expert)
    base = n_tokens   # staging slots start there
    remap, plan = make_plan(device, ids, n_expert, stage_base=base)
    try:
        got = read_tensor(plan)
        assert got[0] == len(experts)
        np.testing.assert_array_equal(got[1:1 + 2 * len(experts):2], experts)
        np.testing.assert_array_equal(got[2:2 + 2 * len(experts):2], base + np.arange(len(experts)))
        assert (got[plan_words(n_expert):] == 7777).all(), "wrote past the plan"
        np.testing.assert_array_equal(read_tensor(remap).reshape(ids.shape), np.where(remap_ref >= 0, remap_ref + base, -1))
    finally:
        remap.close()
        plan.close()


@pytest.mark.parametrize("name,k,m,unit", [("Q4_0", 256, 4, 16), ("Q4_0", 64, 2, 4), ("Q4_K", 256, 3, 16),
                                           ("F32", 5, 3, 4)])
def test_copy_moves_exactly_the_planned_experts(device, name, k, m, unit):
    n_expert, n_slots = 7, 5
    rng = np.random.default_rng(k + m)
    raw = random_blocks(name, m * n_expert, k, rng)
    stack = weight_tensor(device, name, raw, (k, m, n_expert))
    assert stage_unit(stack) == unit
    ids = np.array([[5, 1], [1, 6], [0, 5]], np.int32)
    experts, _ = plan_reference(ids, n_expert)
    per_expert = raw.reshape(n_expert, -1)
    slots = Tensor.empty(device, name, (k, m, n_slots))
    sentinel = np.full(slots.nbytes, 0xA5, np.uint8)
    if not slots.type.quantized:
        sentinel = sentinel.view(slots.type.dtype)
    write_tensor(slots, sentinel)
    remap, plan = make_plan(device, ids, n_expert)
    try:
        for max_binding in (None, 3 * per_expert.shape[1]):   # whole stack, or 2 experts per binding
            write_tensor(slots, sentinel)
            run_once(device, lambda seq: moe_stage_copy(seq, stack, slots, plan, n_slots, max_binding=max_binding))
            got = read_tensor(slots).view(np.uint8).reshape(n_slots, -1)
            np.testing.assert_array_equal(got[:len(experts)], per_expert[experts])
            assert (got[len(experts):] == 0xA5).all(), "an unplanned slot was written"
    finally:
        for t in (stack, slots, remap, plan):
            t.close()


def test_unaligned_stack_is_refused(device):
    stack = Tensor.empty(device, "Q4_0", (32, 3, 4))   # 54 bytes per expert: not 4-byte aligned
    slots = Tensor.empty(device, "Q4_0", (32, 3, 4))
    try:
        assert stage_unit(stack) == 0
        with pytest.raises(UnsupportedShape, match="4-byte aligned experts"):
            run_once(device, lambda seq: moe_stage_copy(seq, stack, slots, slots, 4))
    finally:
        stack.close()
        slots.close()


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q6_K", "F16", "IQ4_XS", "IQ2_XXS", "MXFP4"])
def test_mat_vec_on_staged_experts_is_bit_identical(device, name):
    k, m, n_expert, n_used, n_tokens = 256, 8, 9, 3, 2
    rng = np.random.default_rng(3)
    raw = random_blocks(name, m * n_expert, k, rng, scale=0.5)
    stack = weight_tensor(device, name, raw, (k, m, n_expert))
    ids = np.stack([rng.choice(n_expert, n_used, replace=False) for _ in range(n_tokens)]).astype(np.int32)
    x = rng.standard_normal((n_tokens, 1, k)).astype(np.float32)
    slots = Tensor.empty(device, name, (k, m, n_used * n_tokens))
    remap, plan = make_plan(device, ids, n_expert)
    try:
        run_once(device, lambda seq: moe_stage_copy(seq, stack, slots, plan, n_used * n_tokens))
        direct = run(device, stack, x, ids, m)
        staged = run(device, slots, x, read_tensor(remap).reshape(ids.shape), m)
        np.testing.assert_array_equal(staged.view(np.uint32), direct.view(np.uint32))
    finally:
        for t in (stack, slots, remap, plan):
            t.close()


class LRUReference:
    """The cache policy of moe_stage_plan.comp, in Python."""

    def __init__(self, n_expert, slots, stage_base):
        self.slot_of = {}
        self.owner = [-1] * slots
        self.last = [0] * slots
        self.clock = 0
        self.stage_base = stage_base

    def step(self, ids):
        self.clock += 1
        chosen = sorted({int(e) for e in ids.reshape(-1)})
        dst, copies = {}, []
        for e in chosen:
            if e in self.slot_of:
                dst[e] = self.slot_of[e]
                self.last[dst[e]] = self.clock
        for e in chosen:
            if e in dst:
                continue
            free = [s for s in range(len(self.owner)) if self.last[s] != self.clock]
            if free:
                v = min(free, key=lambda s: (self.last[s], s))
                if self.owner[v] >= 0:
                    del self.slot_of[self.owner[v]]
                self.owner[v], self.last[v], self.slot_of[e], dst[e] = e, self.clock, v, v
            else:
                dst[e] = self.stage_base + len(copies)   # the i-th copy of the step, i < n_stage
            copies.append((e, dst[e]))
        return np.vectorize(dst.get)(ids), copies


@pytest.mark.parametrize("cache_slots,n_tokens", [(6, 1), (3, 2), (20, 3)])
def test_cache_follows_lru_and_slots_hold_their_experts(device, cache_slots, n_tokens):
    """Over 12 steps of skewed routing: remap and copies equal the Python LRU; after each step's
    copies every pair's slot holds the expert it chose; hits are never copied again."""
    name, k, m, n_expert, n_used = "Q4_0", 64, 2, 16, 2
    rng = np.random.default_rng(cache_slots)
    raw = random_blocks(name, m * n_expert, k, rng)
    per_expert = raw.reshape(n_expert, -1)
    stack = weight_tensor(device, name, raw, (k, m, n_expert))
    n_stage = n_used * n_tokens
    pool = Tensor.empty(device, name, (k, m, cache_slots + n_stage))
    state = tensor_from_numpy(device, initial_cache_state(n_expert, cache_slots))
    assert state.nelements == cache_state_words(n_expert, cache_slots)
    remap = Tensor.empty(device, I32, (n_used, n_tokens))
    plan = Tensor.empty(device, I32, (plan_words(n_expert),))
    ref = LRUReference(n_expert, cache_slots, cache_slots)
    hot = rng.choice(n_expert, 4, replace=False)
    copied, chosen_per_step = 0, []
    try:
        for step in range(12):
            ids_np = np.stack([rng.choice(hot if rng.random() < 0.6 else n_expert, n_used, replace=False)
                               for _ in range(n_tokens)]).astype(np.int32)
            chosen_per_step.append(ids_np)
            ids = tensor_from_numpy(device, ids_np)

            def record(seq):
                moe_stage_plan(seq, ids, remap, plan, n_expert, state=state, cache_slots=cache_slots,
                               stage_base=cache_slots)
                moe_stage_copy(seq, stack, pool, plan, n_stage)
            run_once(device, record)
            ids.close()
            want_remap, want_copies = ref.step(ids_np)
            got_remap = read_tensor(remap).reshape(ids_np.shape)
            np.testing.assert_array_equal(got_remap, want_remap, err_msg=f"step {step}")
            got_plan = read_tensor(plan)
            got_copies = [(int(got_plan[1 + 2 * i]), int(got_plan[2 + 2 * i])) for i in range(got_plan[0])]
            assert got_copies == want_copies, f"step {step}"
            slots_now = read_tensor(pool).view(np.uint8).reshape(cache_slots + n_stage, -1)
            for e, slot in zip(ids_np.reshape(-1), got_remap.reshape(-1)):
                np.testing.assert_array_equal(slots_now[slot], per_expert[e])
            copied += len(got_copies)
        assert copied < 12 * n_used * n_tokens, "the cache never hit"
        chosen = sum(len(set(r.reshape(-1))) for r in chosen_per_step)
        assert cache_counts(read_tensor(state)) == (chosen - copied, copied)
    finally:
        for t in (stack, pool, state, remap, plan):
            t.close()
