"""One host-resident MoE layer's expert plan for a step (host_experts.py), compiled: which chosen
experts the GPU reads from its VRAM cache, which are copied over the link (into the cache, the
least recently used slot replaced, or a staging slot without one) and which the CPU computes."""

from __future__ import annotations

import math

import numpy as np
from numba import njit


# the host's part of one hybrid layer step (the wait for the routing, the plan, two submissions),
# what a host-planned step costs beyond the GPU-planned one: ~130 us measured on the H100 box
HOST_STEP_SECONDS = 150e-6


def copy_share(mode: str, link_gbps: float | None, cpu_gbps: float | None, cache_fits_all: bool = False) -> float:
    """The share of a step's uncached experts to copy rather than compute on the CPU: none
    ("all"), every one ("off", or "auto" where the layer's cache holds all its experts: a copy is
    then never copied again), else for "auto" the split that has the link and the CPU finish
    together at their rates (half where a rate is unknown)."""
    if mode == "all":
        return 0.0
    if mode == "off" or cache_fits_all:
        return 1.0
    if not link_gbps or not cpu_gbps:
        return 0.5
    return link_gbps / (link_gbps + cpu_gbps)


def hybrid_pays(k: int, expert_bytes: int, link_gbps: float, cpu_gbps: float) -> bool:
    """Whether a step of k uncached experts (expert_bytes each) ends sooner split between the link
    and the CPU, with the host's HOST_STEP_SECONDS, than with every expert copied."""
    n_copy = copies(k, copy_share("auto", link_gbps, cpu_gbps))
    split = max(n_copy * expert_bytes / (link_gbps * 1e9), (k - n_copy) * expert_bytes / (cpu_gbps * 1e9))
    return split + HOST_STEP_SECONDS < k * expert_bytes / (link_gbps * 1e9)


def copies(n_missing: int, share: float) -> int:
    """How many of `n_missing` uncached experts a copy share copies (rounded half up)."""
    return int(math.floor(n_missing * share + 0.5))


# a (token, expert) pair on the CPU whose expert's rows another pair of the step already read
# costs this share of one that reads them from RAM (the dot products remain)
REUSE_COST = 0.6


def prompt_on_host(n_tokens: int, n_expert: int, k: int, expert_bytes: int, max_copies: int, link_gbps: float,
                   cpu_gbps: float, streams: bool, every_cpu: bool = False) -> bool:
    """Whether a step of n_tokens ends sooner with its chosen experts split between the link (at
    most max_copies) and the CPU (every_cpu: all on the CPU) than with every expert of the layer
    streamed to the GPU (streams) or the chosen ones read over the link in place."""
    distinct = n_expert * (1 - (1 - k / n_expert) ** n_tokens)
    per_expert = n_tokens * k / distinct
    cpu_eff = cpu_gbps / (1 + (per_expert - 1) * REUSE_COST)
    n_copy = 0 if every_cpu else min(max_copies, distinct * link_gbps / (link_gbps + cpu_eff))
    host = max(n_copy * expert_bytes / (link_gbps * 1e9), (distinct - n_copy) * expert_bytes / (cpu_eff * 1e9))
    gpu = (n_expert if streams else distinct) * expert_bytes / (link_gbps * 1e9)
    return host + HOST_STEP_SECONDS < gpu


@njit(cache=True, nogil=True)
def plan_step(ids, weights, k, slot_of, expert_in, used, hot, stamp, share, max_copies, stage_base, zero,
              remap, gpu_w, plan, cpu_e, cpu_t, cpu_w):
    """Plan the pairs ids/weights (flat, token-major, k a token) and write the GPU's `remap` (slot
    a pair), `gpu_w` (its weight, 0 for the CPU's pairs) and `plan` (count, then expert and slot
    of each copy: at most max_copies); the CPU's pairs go to cpu_e / cpu_t / cpu_w. The cache (slot_of, expert_in,
    used) and the CPU run counts `hot` are updated. Returns (CPU pairs, experts copied, pairs
    copied, pairs on the GPU)."""
    n_expert, slots = slot_of.size, expert_in.size
    dest = np.full(n_expert, -1, np.int64)
    keep = np.zeros(max(slots, 1), np.bool_)
    missing = np.empty(ids.size, np.int64)
    n_missing = 0
    for p in range(ids.size):
        e = ids[p]
        if dest[e] != -1:
            continue
        if slots and slot_of[e] >= 0:
            dest[e] = slot_of[e]
            keep[slot_of[e]] = True
            used[slot_of[e]] = stamp
        else:
            dest[e] = -2   # seen, not placed yet
            missing[n_missing] = e
            n_missing += 1
    for i in range(1, n_missing):   # the experts that kept running on the CPU first (stable)
        e = missing[i]
        j = i
        while j > 0 and hot[missing[j - 1]] < hot[e]:
            missing[j] = missing[j - 1]
            j -= 1
        missing[j] = e
    n_copy = min(int(math.floor(n_missing * share + 0.5)), max_copies)
    copied = 0
    for i in range(n_copy):
        e = missing[i]
        if slots:
            slot = -1
            for s in range(slots):
                if not keep[s] and (slot < 0 or used[s] < used[slot]):
                    slot = s
            if slot < 0:
                break
            old = expert_in[slot]
            if old >= 0:
                slot_of[old] = -1
            expert_in[slot], slot_of[e], used[slot], keep[slot] = e, slot, stamp, True
        else:
            slot = stage_base + i
        dest[e] = slot
        plan[1 + 2 * copied] = e
        plan[2 + 2 * copied] = slot
        copied += 1
    plan[0] = copied
    n_cpu = copied_pairs = on_gpu = 0
    for p in range(ids.size):
        e = ids[p]
        if dest[e] >= 0:
            remap[p] = dest[e]
            gpu_w[p] = weights[p]
            on_gpu += 1
            for c in range(copied):
                if plan[1 + 2 * c] == e:
                    copied_pairs += 1
                    break
        else:
            remap[p] = zero
            gpu_w[p] = 0.0
            cpu_e[n_cpu], cpu_t[n_cpu], cpu_w[n_cpu] = e, p // k, weights[p]
            hot[e] += 1
            n_cpu += 1
    return n_cpu, copied, copied_pairs, on_gpu
