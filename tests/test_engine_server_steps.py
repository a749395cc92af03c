"""A server's decode steps of several sequences on an MoE model (vkrt issue 16): the routed
experts run as mat-vecs up to tuning.mv_id_max_n tokens, not as the route table and the GEMM
(whose 64-token tile a chosen expert is nearly empty at 16 slots), and pick the tokens the GEMM
picked; a step of a shape seen before records no graph."""

import dataclasses

import numpy as np
from models import tiny_model

from vkrt.device import Device
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model

SLOTS = 16


def decode_steps(device, path: str) -> tuple[list, int, int, int]:
    """(each step's candidates, dispatches of the step's graph, graphs the second step recorded,
    the model's layers) of two decode_candidates steps of SLOTS sequences, each after a 4-token prompt."""
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=256, n_ubatch=32, n_seq_max=SLOTS) as e:
        for s in range(SLOTS):
            e.eval([3 + s, 5, 7 + s, 11], seq_id=s)
        first = e.decode_candidates([(s, 20 + s) for s in range(SLOTS)])
        recorded = e.stats.graphs_recorded
        second = e.decode_candidates([(s, int(first[1][s, 0])) for s in range(SLOTS)])
        step = [g for key, g in e.steps.graphs.items() if key.n_tokens == SLOTS]
        assert len(step) == 1
        return ([first, second], sum(s.dispatch_count for s in step[0].seqs), e.stats.graphs_recorded - recorded,
                m.cfg.n_layer)


def test_experts_of_a_16_slot_step_run_as_mat_vecs(device, tmp_path):
    path = tiny_model("tiny-qwen3moe", tmp_path)
    assert device.tuning.mv_max_n < SLOTS <= device.tuning.mv_id_max_n
    steps, dispatches, recorded, n_layer = decode_steps(device, path)
    assert recorded == 0, "the second step of the same shape recorded a graph"
    with Device() as gemm_device:   # the GEMM past mv_max_n tokens, as before
        gemm_device.tuning = dataclasses.replace(gemm_device.tuning, mv_id_max_n=gemm_device.tuning.mv_max_n)
        gemm_steps, gemm_dispatches, *_ = decode_steps(gemm_device, path)
    assert gemm_dispatches - dispatches >= 3 * n_layer   # a route count before each of gate, up, down
    for (values, ids), (gemm_values, gemm_ids) in zip(steps, gemm_steps):
        np.testing.assert_array_equal(ids[:, 0], gemm_ids[:, 0])
        np.testing.assert_allclose(values[:, :8], gemm_values[:, :8], rtol=1e-4, atol=1e-4)
