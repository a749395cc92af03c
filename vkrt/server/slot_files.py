"""Slot files (--slot-save-path, llama-server's): POST /slots/{id}?action=save|restore|erase.

save writes an idle slot's tokens, their KV cells and (models with DeltaNet layers) its recurrent
state to a file in the folder; restore gives an idle slot what a file holds, so the next prompt
sharing its prefix resumes from it (what the slot held goes to the prompt cache in host RAM
first); erase forgets what the slot holds. A file starts with MAGIC, a format number and a JSON
header naming the model and the cache layout it fits; restore refuses any other. File names stay
inside the folder: no separators, no "..", no links pointing out.

A slot holding an image keeps it: its tokens are the image's placeholder ids (from the image's
hash, model/media_prompt.py), so a prompt with the same image resumes from the file as from the
slot, and the cells' rotary positions (KVBlock.rope and .after: the image's grid under M-RoPE,
the text after it going on past it) follow the KV rows. Format 2 added those positions (the
header's "rope") and placeholder ids; format 1 files (text only) still load."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import tempfile
import time

import numpy as np
from aiohttp import web

from ..engine.kv_transfer import KVBlock, kv_layout
from ..errors import VkrtError
from .prompt_cache import SavedPrefix, capture
from .request_work import in_thread
from .validation import ApiError, BadRequest, get_str

MAGIC = b"VKRTSLOT"
FORMAT = 2
READS = (1, 2)   # the formats restore reads
PLACEHOLDER_MIN = -(1 << 30)   # an image's placeholder ids lie in [PLACEHOLDER_MIN, -1] (ImageChunk.placeholders)
_HEAD = struct.Struct("<8sII")   # magic, format, header bytes
BAD_NAME_CHARS = set('/\\:*?"<>|') | {"\u2215", "\u2044", "\uff0f", "\u29f8", "\ufeff"}


class SlotBusy(ApiError):
    """The slot holds a request: slot actions take an idle one."""


def check_filename(name: str) -> str:
    """`name` if it is a plain file name (no separators, control characters or NUL, not . or ..,
    no space at either end nor a dot at the end, at most 255 bytes), else BadRequest."""
    bad = (not name or len(name.encode("utf-8", "surrogatepass")) > 255 or name in (".", "..")
           or name != name.strip() or name.endswith(".")
           or any(c in BAD_NAME_CHARS or ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) < 0xE000 for c in name))
    if bad:
        raise BadRequest(f"Invalid filename {name!r}: give a plain file name inside --slot-save-path (no path "
                         f"separators, '..', control characters or surrounding spaces)", "filename")
    return name


def slot_path(folder: str, name: str) -> str:
    """The file `name` in `folder`, refused (BadRequest) where a link would take it outside."""
    path = os.path.join(folder, check_filename(name))
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(folder):
        raise BadRequest(f"Invalid filename {name!r}: it links outside --slot-save-path", "filename")
    return path


def model_identity(model) -> dict:
    cfg = model.cfg
    return {"arch": cfg.arch, "name": str(model.gguf.metadata.get("general.name", "")), "n_layer": cfg.n_layer,
            "n_embd": cfg.n_embd, "n_vocab": cfg.vocab_size, "n_params": model.n_params}


def _describe(ident: dict) -> str:
    return f"{ident.get('name') or '?'!r} ({ident.get('arch')}, {ident.get('n_layer')} layers, " \
           f"{ident.get('n_params')} parameters)"


def encode(model, engine, entry: SavedPrefix) -> list:
    """The file's parts (bytes and arrays) for `entry`: its tokens, KV rows, the cells' rotary
    positions where they moved (images) and the state at its end."""
    n = len(entry.tokens)
    state = entry.states.get(n, [])
    kv = entry.kv
    rope = kv.rope is not None
    header = json.dumps({"model": model_identity(model), "layout": kv_layout(engine), "n_tokens": n,
                         "state": bool(state), "rope": rope}).encode()
    parts = [_HEAD.pack(MAGIC, FORMAT, len(header)), header, entry.tokens]
    for il in sorted(kv.layers):
        parts += [np.ascontiguousarray(a) for a in kv.layers[il]]
    if rope:
        parts += [np.ascontiguousarray(kv.rope, np.int32), np.ascontiguousarray(kv.after, np.int32)]
    return parts + list(state)


def decode(model, engine, data: bytes, name: str) -> SavedPrefix:
    """The SavedPrefix in a file's bytes; BadRequest naming what does not fit this server."""
    def refuse(why: str):
        raise BadRequest(f"Unable to restore slot from {name!r}: {why}", "filename")
    if len(data) < _HEAD.size:
        refuse("it is not a vkrt slot file (too short)")
    magic, fmt, size = _HEAD.unpack_from(data)
    if magic != MAGIC:
        refuse("it is not a vkrt slot file")
    if fmt not in READS:
        refuse(f"it has format {fmt}; this server reads formats {', '.join(map(str, READS))}")
    try:
        header = json.loads(data[_HEAD.size:_HEAD.size + size])
        ident, layout, n, has_state = header["model"], header["layout"], int(header["n_tokens"]), header["state"]
        has_rope = header["rope"] if fmt >= 2 else False
        if not isinstance(has_rope, bool) or not isinstance(has_state, bool):
            raise TypeError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        refuse("its header is damaged")
    mine = model_identity(model)
    if ident != mine:
        refuse(f"it was saved from model {_describe(ident)}; this server runs {_describe(mine)}")
    here = kv_layout(engine)
    if layout.get("kv_rotation", [0, 0]) != here["kv_rotation"]:   # files from before the rotation have none
        refuse(f"its quantised KV rows are rotated in runs {layout.get('kv_rotation', [0, 0])} (K, V; 0: not "
               f"rotated), this server's in {here['kv_rotation']} (VKRT_KV_ROTATION differs, or an older vkrt "
               "saved it)")
    for key, what in (("kv_type", "KV cache type"), ("layers", "attention layers (row bytes, heads)"),
                      ("state_bytes", "recurrent state (bytes a sequence on each device)")):
        if layout.get(key) != here[key]:
            refuse(f"its {what} {layout.get(key)} differ from this server's {here[key]} (another KV type or "
                   f"layer split?)")
    if engine.recurrent and not has_state:
        refuse("it holds no recurrent state")
    at = _HEAD.size + size
    sizes = [4 * n] + [h * n * row for _, (k, v, h) in sorted(here["layers"].items(), key=lambda kv: int(kv[0]))
                       for row in (k, v)] + ([12 * n, 4 * n] if has_rope else []) + \
        (here["state_bytes"] if has_state else [])
    if n < 0 or len(data) != at + sum(sizes):
        refuse(f"it is truncated or damaged ({len(data)} bytes; {n} tokens take {at + sum(sizes)})")
    arrays = []
    for s in sizes:
        arrays.append(np.frombuffer(data, np.uint8, s, at))
        at += s
    tokens = arrays[0].view(np.int32)
    layers = {}
    for j, (il, (k, v, h)) in enumerate(sorted(here["layers"].items(), key=lambda kv: int(kv[0]))):
        layers[int(il)] = (arrays[1 + 2 * j].reshape(h, n, k), arrays[2 + 2 * j].reshape(h, n, v))
    lowest = PLACEHOLDER_MIN if fmt >= 2 else 0   # format 1 held text only
    if tokens.size and not (lowest <= tokens.min() and tokens.max() < model.cfg.vocab_size):
        refuse("it holds token ids outside this model's vocabulary")
    at = 1 + 2 * len(layers)
    rope = after = None
    if has_rope:
        rope, after = arrays[at].view(np.int32).reshape(n, 3), arrays[at + 1].view(np.int32)
        at += 2
        if n and (rope.min() < 0 or (after <= rope.max(axis=1)).any()):
            refuse("its rotary positions are damaged")
    states = {n: arrays[at:]} if has_state else {}
    return SavedPrefix(tokens, KVBlock(n, layers, rope, after), states)


def write_file(path: str, parts: list) -> int:
    """Write `parts` to `path` through a temporary file in its folder (an existing file is replaced
    only once the new one is whole); returns the bytes written."""
    fd, tmp = tempfile.mkstemp(prefix=".vkrt-slot-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            for p in parts:
                f.write(p if isinstance(p, bytes) else memoryview(np.ascontiguousarray(p)).cast("B"))
            n = f.tell()
        os.replace(tmp, path)
        return n
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_file(path: str, name: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise BadRequest(f"Unable to restore slot: there is no file {name!r} in --slot-save-path", "filename") from None
    except OSError as exc:
        raise BadRequest(f"Unable to restore slot from {name!r}: {exc.strerror}", "filename") from None


# -- on the scheduler thread ---------------------------------------------------------------------
def _idle_slot(sched, id_slot: int):
    slot = sched.slots[id_slot]
    if not slot.idle:
        raise SlotBusy(f"slot {id_slot} is processing a request: save, restore and erase take an idle slot "
                       f"(GET /slots shows when it is)", status=409)
    return slot


def _capture(sched, id_slot: int, engine) -> SavedPrefix | None:
    slot = _idle_slot(sched, id_slot)
    entry = capture(engine, slot.id, slot.cache, sched.checkpoints[slot.id])
    if entry is not None and engine.recurrent:   # the file holds the state at its end only
        entry.states = {len(entry.tokens): entry.states[len(entry.tokens)]}
    return entry


def _restore(sched, id_slot: int, entry: SavedPrefix, engine) -> None:
    slot = _idle_slot(sched, id_slot)
    n = len(entry.tokens)
    if n > slot.n_ctx:
        raise BadRequest(f"Unable to restore slot: the file holds {n} tokens, slot {id_slot} has room for {slot.n_ctx}")
    try:   # what the slot held goes to the prompt cache, not lost
        sched.prompt_cache.put_back(engine, slot, sched.checkpoints[slot.id], entry, n)
    except VkrtError as exc:
        engine.reset(slot.id)
        raise BadRequest(f"Unable to restore slot, no available space in KV cache: {exc}") from None
    slot.cache = entry.tokens.tolist()


def _erase(sched, id_slot: int, engine) -> int:
    slot = _idle_slot(sched, id_slot)
    n = len(slot.cache)
    engine.reset(slot.id)
    sched.checkpoints[slot.id].drop(engine)
    slot.cache = []
    return n


async def _on_thread(sched, fn):
    return await asyncio.wrap_future(sched.call(fn))


async def slot_action(state, request: web.Request) -> web.Response:
    """POST /slots/{id_slot}?action=save|restore|erase with {"filename": ...} (save, restore)."""
    from .routes import read_body

    folder = state.config.slot_save_path
    if not folder:
        raise ApiError("This server does not support slots action. Start it with `--slot-save-path`", status=501,
                       type="not_supported_error")
    sched = state.scheduler
    try:
        id_slot = int(request.match_info["id_slot"])
    except ValueError:
        raise BadRequest("Invalid slot ID") from None
    if not 0 <= id_slot < len(sched.slots):
        raise BadRequest(f"Invalid slot ID {id_slot}: this server has slots 0 to {len(sched.slots) - 1}")
    action = request.query.get("action", "")
    if action == "erase":
        n = await _on_thread(sched, lambda engine: _erase(sched, id_slot, engine))
        return web.json_response({"id_slot": id_slot, "n_erased": n})
    if action not in ("save", "restore"):
        raise BadRequest(f"Invalid action {action!r}: give ?action=save, restore or erase")
    name = get_str(await read_body(request, state), "filename")
    path = slot_path(folder, name)
    t0 = time.perf_counter()
    if action == "save":
        entry = await _on_thread(sched, lambda engine: _capture(sched, id_slot, engine))
        if entry is None:
            raise BadRequest(f"slot {id_slot} holds no tokens that can be saved")
        n = len(entry.tokens)
        try:
            n_written = await in_thread(write_file, path, encode(state.model, state.engine, entry))
        except OSError as exc:
            raise ApiError(f"Unable to save slot to {name!r}: {exc.strerror or exc}", status=500,
                           type="server_error") from None
        return web.json_response({"id_slot": id_slot, "filename": name, "n_saved": n, "n_written": n_written,
                                  "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})
    data = await in_thread(read_file, path, name)
    entry = await in_thread(decode, state.model, state.engine, data, name)
    await _on_thread(sched, lambda engine: _restore(sched, id_slot, entry, engine))
    return web.json_response({"id_slot": id_slot, "filename": name, "n_restored": len(entry.tokens),
                              "n_read": len(data), "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})
