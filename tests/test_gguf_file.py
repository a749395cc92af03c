"""GGUFFile: reading a valid file (mmap and anonymous memory), and a corpus of broken files that
each fail with a GGUFError naming the file and the problem."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from vkrt.commands import read_tensor
from vkrt.errors import GGUFError
from vkrt.model import GGUFFile


def _q(name: str, rows: int, k: int, rng) -> np.ndarray:
    return gguf.quants.quantize(rng.standard_normal((rows, k)).astype(np.float32), Q[name])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small llama-like file: metadata of every kind and tensors of several types."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_name("tiny")
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "hello", "world"])
    w.add_array("tokenizer.ggml.scores", [0.0, 0.0, -1.5, -2.5])
    k4 = rng.integers(0, 256, (4, 144), dtype=np.uint8)
    k4[:, :2] = np.array([0.01], np.float16).view(np.uint8)
    k4[:, 2:4] = np.array([0.02], np.float16).view(np.uint8)
    tensors = {
        "token_embd.weight": (_q("Q8_0", 8, 64, rng), Q.Q8_0),
        "blk.0.attn_norm.weight": (rng.standard_normal(64).astype(np.float32), None),
        "blk.0.attn_q.weight": (_q("Q4_0", 64, 64, rng), Q.Q4_0),
        "blk.0.attn_k.weight": (_q("Q4_1", 16, 64, rng), Q.Q4_1),
        "blk.0.ffn_up.weight": (k4, Q.Q4_K),
        "output.weight": (rng.standard_normal((8, 64)).astype(np.float16), None),
    }
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, {name: data for name, (data, _) in tensors.items()}


def layout(path) -> dict:
    """Byte positions of the header counts and of each tensor table entry's fields."""
    r = gguf.GGUFReader(path)
    pos = {"tensor_count": 8, "kv_count": 16, "data": r.data_offset, "size": len(r.data)}
    for t in r.tensors:
        off = t.field.offset
        name_len = len(t.name.encode())
        n_dims = len(t.shape)
        pos[t.name] = {"entry": off, "name": off + 8, "n_dims": off + 8 + name_len, "dims": off + 12 + name_len,
                       "type": off + 12 + name_len + 8 * n_dims, "offset": off + 16 + name_len + 8 * n_dims,
                       "data": t.data_offset}
    for key in ("general.name", "tokenizer.ggml.tokens"):
        f = r.fields[key]
        klen = len(key.encode())
        pos[key] = {"entry": f.offset, "type": f.offset + 8 + klen, "value": f.offset + 12 + klen}
    return pos


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "no-mmap"])
def test_reads_metadata_and_tensors(model, mmap):
    path, tensors = model
    with GGUFFile(path, mmap=mmap, progress=False) as f:
        assert f.architecture == "llama" and f["llama.block_count"] == 1 and f.get("general.name") == "tiny"
        assert f["tokenizer.ggml.tokens"] == ["<s>", "</s>", "hello", "world"]
        assert f["tokenizer.ggml.scores"] == [0.0, 0.0, -1.5, -2.5]
        assert list(f.tensors) == list(tensors)
        assert f.tensors["blk.0.ffn_up.weight"].ne == (256, 4) and f.tensors["blk.0.ffn_up.weight"].type.name == "Q4_K"
        assert f.tensors["output.weight"].ne == (64, 8) and f.tensors["output.weight"].type.name == "F16"
        for name, data in tensors.items():
            np.testing.assert_array_equal(f.array(name), data)
        q = f.tensors["blk.0.attn_q.weight"]
        np.testing.assert_array_equal(f.dequantize(q.name), gguf.quants.dequantize(tensors[q.name], Q.Q4_0))
    with pytest.raises(GGUFError, match="closed"):
        f.data("output.weight")


def test_upload_with_progress(device, model, capsys):
    path, tensors = model
    with GGUFFile(path, mmap=False, progress=True) as f:
        up = f.upload(device)
        try:
            for name, data in tensors.items():
                np.testing.assert_array_equal(read_tensor(up[name]).reshape(data.shape), data)
        finally:
            for t in up.values():
                t.close()
    assert "uploading tiny.gguf" in capsys.readouterr().err


def test_require_names_everything_missing(model):
    path, _ = model
    with GGUFFile(path, progress=False) as f:
        f.require(keys=["llama.block_count"], tensors=["output.weight"])
        with pytest.raises(GGUFError) as e:
            f.require(keys=["llama.block_count", "llama.embedding_length", "llama.attention.head_count"],
                      tensors=["output.weight", "blk.0.ffn_down.weight"])
        msg = str(e.value)
        assert str(path) in msg and "llama.embedding_length" in msg and "llama.attention.head_count" in msg
        assert "blk.0.ffn_down.weight" in msg and "llama model" in msg
        with pytest.raises(GGUFError, match="metadata key 'nope' is missing"):
            f["nope"]
        with pytest.raises(GGUFError, match="no tensor 'nope'"):
            f.tensor("nope")


def _u32(v):
    return struct.pack("<I", v)


def _u64(v):
    return struct.pack("<Q", v)


# (id, how to break the file given its layout, what the error says)
BROKEN = [
    ("empty", lambda b, p: b[:0], "not a GGUF file"),
    ("bad-magic", lambda b, p: b"GGML" + b[4:], r"not a GGUF file: it starts with b'GGML'"),
    ("text-file", lambda b, p: b"hello, world\n" * 10, "not a GGUF file"),
    ("version-1", lambda b, p: b[:4] + _u32(1) + b[8:], "unsupported GGUF version 1"),
    ("version-99", lambda b, p: b[:4] + _u32(99) + b[8:], "unsupported GGUF version 99"),
    ("big-endian", lambda b, p: b[:4] + struct.pack(">I", 3) + b[8:], "big-endian"),
    ("cut-in-magic", lambda b, p: b[:3], "not a GGUF file"),
    ("cut-in-counts", lambda b, p: b[:14], "truncated"),
    ("cut-in-first-key", lambda b, p: b[:30], "truncated"),
    ("cut-in-metadata", lambda b, p: b[:p["tokenizer.ggml.tokens"]["value"] + 20], "truncated"),
    ("cut-in-tensor-table", lambda b, p: b[:p["output.weight"]["entry"] + 5], "truncated"),
    ("cut-in-data", lambda b, p: b[:p["size"] - 100], r"'output.weight'.*truncated"),
    ("cut-at-data-start", lambda b, p: b[:p["data"]], "truncated"),
    ("unknown-type-id", lambda b, p: _put(b, p["blk.0.attn_q.weight"]["type"], _u32(99)),
     r"'blk.0.attn_q.weight' has unknown GGML type id 99"),
    ("unsupported-type", lambda b, p: _put(b, p["blk.0.attn_q.weight"]["type"], _u32(Q.Q8_K)),
     r"'blk.0.attn_q.weight' has type Q8_K, which vkrt does not support; supported types: F32, F16"),
    ("huge-dims", lambda b, p: _put(b, p["output.weight"]["dims"] + 8, _u64(1 << 40)),
     r"'output.weight' \(F16\[64, 1099511627776\].*needs bytes"),
    ("many-dims", lambda b, p: _put(b, p["output.weight"]["n_dims"], _u32(1000)), "1000 dimensions"),
    ("zero-dim", lambda b, p: _put(b, p["output.weight"]["dims"], _u64(0)), "must be at least 1"),
    ("offset-out-of-range", lambda b, p: _put(b, p["output.weight"]["offset"], _u64(1 << 40)),
     r"'output.weight'.*needs bytes \[\d+, \d+\) but the file has \d+"),
    ("offset-misaligned", lambda b, p: _put(b, p["output.weight"]["offset"],
                                            _u64(p["output.weight"]["data"] - p["data"] + 2)), "alignment 32"),
    ("overlap", lambda b, p: _put(b, p["blk.0.attn_k.weight"]["offset"],
                                  _u64(p["blk.0.attn_q.weight"]["data"] - p["data"] + 64)), "overlap"),
    ("block-size", lambda b, p: _put(b, p["token_embd.weight"]["dims"], _u64(48)),
     r"ne\[0\] = 48, not a multiple of the Q8_0 block size 32"),
    ("duplicate-name", lambda b, p: _put(b, p["blk.0.attn_k.weight"]["name"] + 11, b"q"), "appears twice"),
    ("huge-kv-count", lambda b, p: _put(b, 16, _u64(1 << 50)), "metadata key/value count"),
    ("huge-tensor-count", lambda b, p: _put(b, 8, _u64(1 << 50)), "tensor count"),
    ("huge-array", lambda b, p: _put(b, p["tokenizer.ggml.tokens"]["value"] + 4, _u64(1 << 60)), "array item count"),
    ("huge-string", lambda b, p: _put(b, p["general.name"]["value"], _u64(1 << 60)), "truncated"),
    ("bad-value-type", lambda b, p: _put(b, p["general.name"]["type"], _u32(77)), "unknown value type 77"),
]


def _put(b: bytes, at: int, data: bytes) -> bytes:
    return b[:at] + data + b[at + len(data):]


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "no-mmap"])
@pytest.mark.parametrize("case,breaker,message", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_file(model, tmp_path, case, breaker, message, mmap):
    path, _ = model
    data = path.read_bytes()
    broken = tmp_path / f"{case}.gguf"
    broken.write_bytes(breaker(data, layout(path)))
    with pytest.raises(GGUFError, match=message) as e:
        GGUFFile(broken, mmap=mmap, progress=False)
    assert str(broken) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="cannot read the file"):
        GGUFFile(tmp_path / "absent.gguf")


def test_random_damage_never_crashes(model, tmp_path):
    """Byte flips and cuts anywhere in the header either still open or raise GGUFError."""
    path, _ = model
    data = path.read_bytes()
    header = layout(path)["data"]
    rng = np.random.default_rng(1)
    target = tmp_path / "damaged.gguf"
    outcomes = {"ok": 0, "error": 0}
    for i in range(300):
        b = bytearray(data)
        if i % 3 == 0:
            b = b[:int(rng.integers(0, header + 64))]
        else:
            for at in rng.integers(0, header, int(rng.integers(1, 4))):
                b[at] = int(rng.integers(0, 256))
        target.write_bytes(bytes(b))
        try:
            GGUFFile(target, progress=False).close()
            outcomes["ok"] += 1
        except GGUFError:
            outcomes["error"] += 1
    assert outcomes["error"] > 50
