"""A sequence's KV cells and recurrent state to host memory and back (vkrt/engine/kv_transfer.py):
the rows read are the cache's, wherever the cells lie; a sequence given them back continues bit
for bit as the one they came from, on one device and on a layer split."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from models import TINY, tiny_model

from vkrt.commands.tensor_io import read_tensor
from vkrt.device.group import DeviceGroup
from vkrt.engine.engine import Engine
from vkrt.engine.kv_transfer import MAX_RUNS, kv_layout, read_checkpoint, read_kv, read_state, write_kv, write_state
from vkrt.engine.options import EngineOptions, open_engine
from vkrt.errors import VkrtError
from vkrt.model.loader import Model
from vkrt.model.synthetic import write_model

PROMPT = list(range(5, 65, 3))      # 20 tokens
MORE = list(range(100, 124, 2))     # 12 tokens


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("kv-transfer")
    return {n: tiny_model(n, d) for n in ("tiny-qwen3", "tiny-qwen35moe")}


def rows_of(engine, seq_id: int, n: int) -> dict:
    """The cache's K/V rows of a sequence's positions [0, n), gathered from whole tensors."""
    cells = engine.cache.cells.cells_of(seq_id, n)
    out = {}
    for st in engine.stages:
        for il, k in st.cache.k.items():
            v = st.cache.v[il]
            # numpy shape (heads, cells, head_dim) -> the rows' bytes
            out[il] = tuple(np.ascontiguousarray(read_tensor(t)[:, cells]).view(np.uint8).reshape(t.ne[2], n, -1)
                            for t in (k, v))
    return out


def same(block, rows) -> None:
    for il, (k, v) in rows.items():
        np.testing.assert_array_equal(block.layers[il][0], k)
        np.testing.assert_array_equal(block.layers[il][1], v)


@pytest.mark.parametrize("steps", [6, 3 * MAX_RUNS], ids=["runs", "span"])
def test_rows_of_interleaved_cells_round_trip(device, paths, steps):
    """Two sequences decoding in turn hold every other cell: the rows read are theirs (a few runs
    copied one by one, many through the span covering them); written into a third sequence after
    the first is forgotten, they land in its holes and the second's cells between stay as they were."""
    with Model(device, paths["tiny-qwen3"], progress=False) as m, Engine(m, n_ctx=256, n_ubatch=32, n_seq_max=3) as e:
        e.eval(PROMPT[:4], seq_id=0)
        e.eval(PROMPT[4:8], seq_id=1)
        for t in range(steps):
            e.decode([(0, 10 + t), (1, 11 + t)])
        n = e.sequence_length(0)
        block = read_kv(e, 0, n)
        assert block.n_tokens == n and block.nbytes > 0
        same(block, rows_of(e, 0, n))
        other = rows_of(e, 1, e.sequence_length(1))
        e.reset(0)
        write_kv(e, 2, block)
        assert e.sequence_length(2) == n
        same(read_kv(e, 2, n), block.layers)
        same(read_kv(e, 1, e.sequence_length(1)), other)
        with pytest.raises(VkrtError, match="must be empty"):
            write_kv(e, 2, block)
        with pytest.raises(VkrtError, match="does not hold positions"):
            read_kv(e, 1, n + 5)


def continue_after(e, seq_id: int) -> np.ndarray:
    return e.eval(MORE, seq_id=seq_id, all_logits=True)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen35moe"])
def test_restored_sequence_continues_bit_for_bit(device, paths, name):
    with Model(device, paths[name], progress=False) as m, \
            Engine(m, n_ctx=128, n_ubatch=32, n_seq_max=2, n_checkpoints=2) as e:
        e.eval(PROMPT)
        ckpt = e.save_state(0)
        block = read_kv(e, 0, len(PROMPT))
        state = read_state(e, 0)
        saved = read_checkpoint(e, ckpt) if ckpt is not None else None
        fresh = continue_after(e, 0)
        e.reset()
        write_kv(e, 0, block)
        write_state(e, 0, state, len(PROMPT))
        np.testing.assert_array_equal(continue_after(e, 0), fresh)
        if e.recurrent:   # a checkpoint's bytes are the live state's at its length
            assert [s.tobytes() for s in saved] == [s.tobytes() for s in state]
            e.release_state(ckpt)
            assert kv_layout(e)["state_bytes"] == [e.state.slot_bytes]
            with pytest.raises(VkrtError, match="does not fit"):
                write_state(e, 0, [state[0][:-4]], 3)
        else:
            assert state == [] and kv_layout(e)["state_bytes"] == []


def test_layer_split_round_trip(tmp_path):
    """Each stage's layers go to and from host memory: resumed logits equal the uninterrupted ones."""
    path = os.path.join(tmp_path, "hybrid-8.gguf")
    write_model(path, dataclasses.replace(TINY["tiny-qwen35moe"], n_layer=8))
    with DeviceGroup(["0", "0"]) as g:
        m, e = open_engine(g.devices, path, EngineOptions(n_ctx=128, n_ubatch=32, progress=False))
        try:
            assert e.split and len([st for st in e.stages if st.cache.k]) == 2
            e.eval(PROMPT)
            block, state = read_kv(e, 0, len(PROMPT)), read_state(e, 0)
            assert len(state) == 2
            fresh = continue_after(e, 0)
            e.reset()
            write_kv(e, 0, block)
            write_state(e, 0, state, len(PROMPT))
            np.testing.assert_array_equal(continue_after(e, 0), fresh)
        finally:
            e.close()
            m.close()
