"""The step input flagging a step's attention mask all zero on its live cells: written 1 for one
sequence's decode (the decode-sized flash attention then reads no mask) and 0 wherever a live
cell is hidden (another sequence's cells, a later token of a verified block, outside a sliding
window); logits bit-identical to the mask read every step."""

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine.step_inputs import StepInputs
from vkrt.model.loader import Model


def _spy(monkeypatch, seen: list, force_zero: bool = False):
    """Record each step's flags as written (name, value); force_zero writes 0 instead."""
    original = StepInputs._flag

    def flag(self, host, lay, name, mask, used):
        original(self, host, lay, name, mask, used)
        if name in lay:
            if force_zero:
                host[lay[name]:lay[name] + 4] = 0
            seen.append((name, int(np.frombuffer(bytes(host[lay[name]:lay[name] + 4]), np.int32)[0])))
    monkeypatch.setattr(StepInputs, "_flag", flag)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gemma3"])
def test_decode_flag_and_logits(device, tmp_path, monkeypatch, name):
    path = tiny_model(name, tmp_path)
    prompt = list(range(3, 30))
    runs = []
    for force_zero in (False, True):
        seen = []
        _spy(monkeypatch, seen, force_zero)
        with Model(device, path, progress=False) as m, Engine(m, n_ctx=256, n_ubatch=32) as e:
            rows = [e.eval(prompt)]
            token = int(rows[0].argmax())
            for _ in range(12):
                rows.append(e.eval([token]))
                token = int(rows[-1].argmax())
        monkeypatch.undo()
        runs.append(np.stack(rows))
        decode = seen[-12 * (2 if name == "tiny-gemma3" else 1):]
        if not force_zero:
            assert seen[0] == ("mask_zero", 0)   # the prompt: later tokens hidden from earlier ones
            # one sequence's decode: the full mask flagged; gemma3's window (8) hides the old cells
            assert ("mask_zero", 1) in decode and all(v == 1 for n, v in decode if n == "mask_zero")
            assert all(v == 0 for n, v in decode if n == "mask_swa_zero")
    np.testing.assert_array_equal(runs[0], runs[1])


def test_two_sequences_and_verify_read_the_mask(device, tmp_path, monkeypatch):
    seen = []
    _spy(monkeypatch, seen)
    with Model(device, tiny_model("tiny-qwen3", tmp_path), progress=False) as m, \
            Engine(m, n_ctx=256, n_ubatch=32, n_seq_max=2) as e:
        e.eval(list(range(3, 20)), seq_id=0)
        e.eval([5], seq_id=0)
        assert seen[-1] == ("mask_zero", 1)
        e.eval(list(range(4, 12)), seq_id=1)   # its cells follow sequence 0's
        e.eval([6], seq_id=1)
        assert seen[-1] == ("mask_zero", 0)
        e.decode([(7, 0), (8, 1)])
        assert seen[-1] == ("mask_zero", 0)
        e.verify([9, 10, 11], seq_id=0)
        assert seen[-1] == ("mask_zero", 0)
