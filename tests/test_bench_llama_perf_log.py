"""llama.cpp's Vulkan perf log (GGML_VK_PERF_LOGGER) as bench/llama_peer.py reads it, and
bench/decode_profile.py --llama's per-step figures from it, on a stand-in for llama-server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from file_modules import ROOT, load

# lines as llama.cpp b10434's Vulkan backend writes them (SmolLM2 on lavapipe), server log lines around
GRAPH = """0.00.579.486 I cmn          init: llama threadpool init, n_threads = 2
----------------
Vulkan Timings:
ADD: 59 x 158.788 us = 9368.5 us
FLASH_ATTN_EXT dst(64,9,{n},1),  q(64,{n},9,1),  k(64,256,3,1),  v(64,256,3,1),  m(256,{n},1,1): 30 x 99457.5 us = 2.98373e+06 us (0.0118608 GFLOPS/s)
MUL_MAT_ADD MUL_MAT_VEC q4_1 m=576 n=1 k=1536: 1 x 951.329 us = 951.329 us (1.85939 GFLOPS/s)
RMS_NORM_MUL RMS_NORM(576,1,1,1): 2 x 999.134 us = 1998.27 us
Total time: 3.50072e+06 us.
0.04.285.611 I srv    load_model: initializing, n_slots = 1
"""


@pytest.fixture()
def peer():
    return load("bench", "llama_peer")


def test_graphs_ops_and_attention_rows(peer):
    graphs = peer.perf_log_graphs("noise\n" + GRAPH.format(n=2) + GRAPH.format(n=256))
    assert len(graphs) == 2
    first = graphs[0]
    assert [op["kind"] for op in first] == ["ADD", "FLASH_ATTN_EXT", "MUL_MAT_ADD", "RMS_NORM_MUL"]
    assert first[0] == dict(op="ADD", kind="ADD", calls=59, us_per_call=158.788, us=59 * 158.788)
    assert first[2]["op"] == "MUL_MAT_ADD MUL_MAT_VEC q4_1 m=576 n=1 k=1536" and first[2]["calls"] == 1
    assert [peer.attention_rows(g) for g in graphs] == [2, 256]
    assert peer.attention_rows(first[:1]) is None
    assert peer.perf_log_graphs("no timings here\n") == []


class FakeServer:
    """llama-server's stand-in: each completion appends a graph a step to its log."""

    calls = []

    def __init__(self, binary, model, args, env=None):
        self.log, self.args, self.env = "", args, env
        FakeServer.flags = args

    rows = None   # the attention's query rows of the timed graphs (None: as llama.cpp would)

    def completion(self, prompt, n_predict, cache_prompt=False):
        assert all(0 < t < 50 for t in prompt)   # within the model's vocabulary
        FakeServer.calls.append((len(prompt), n_predict))
        first = len(FakeServer.calls) == 1
        steps = 1 if first else n_predict
        n = len(prompt) if first else FakeServer.rows or (1 if n_predict > 1 else len(prompt) - 100)
        self.log += "".join(GRAPH.format(n=n) for _ in range(steps))
        return {}

    def tail(self, n=2000):
        return self.log[-n:]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_llama_ops_per_step(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))   # its own imports: common, llama_peer
    prof = load("bench", "decode_profile")
    monkeypatch.setattr(prof, "LlamaServer", FakeServer)
    FakeServer.calls = []
    args = prof.argparse.Namespace(tokens=1, depth=100, model="m.gguf", n_cpu_moe=0, no_mmap=False,
                                   cache_type_k="q8_0", cache_type_v="f16")
    rows = prof.llama_ops("llama-server", args, True, False, 50)
    assert FakeServer.calls == [(100, 1), (100, 4)]   # the depth cached, then 4 decode steps there
    flags = " ".join(FakeServer.flags)
    assert "-ctk q8_0 -ctv f16" in flags   # the profiled step's cache types
    fa = next(r for r in rows if r["kind"] == "FLASH_ATTN_EXT")
    assert fa["calls"] == 30 and fa["us_per_step"] == pytest.approx(30 * 99457.5)
    assert rows[0] is fa   # most time first
    FakeServer.calls = []
    args.tokens = 64
    rows = prof.llama_ops("llama-server", args, True, False, 50)
    assert FakeServer.calls == [(100, 1), (164, 1)]   # a prompt of 64 after the depth: one step
    assert next(r for r in rows if r["kind"] == "ADD")["calls"] == 59
    FakeServer.calls, FakeServer.rows = [], 164   # the depth evaluated again with the prompt
    with pytest.raises(RuntimeError, match=r"attention over \[164\] query rows, not the 64 of the profiled step"):
        prof.llama_ops("llama-server", args, True, False, 50)
    FakeServer.rows = None


def test_llama_without_a_server_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_profile.py"), str(tmp_path / "m.gguf"),
                           "--llama", "--llama-server", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"decode_profile: no such llama-server: {tmp_path / 'none'}; llama.cpp not run"


def test_a_file_that_is_no_model_is_one_line(tmp_path):
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"not a gguf file")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_profile.py"), str(bad), "-ctk", "q8_0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (f"decode_profile: {bad}: not a GGUF file: it starts with b'not ', "
                                   "a GGUF file with b'GGUF'")
