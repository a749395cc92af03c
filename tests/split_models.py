"""Split a GGUF file into parts laid out as llama.cpp's gguf-split writes them: every part a
GGUF file named PREFIX-0000K-of-0000N.gguf; the first holds all the metadata, then split.no
(uint16), split.count (uint16) and split.tensors.count (int32); the others those three keys only;
tensors in file order, consecutive runs of them in each part."""

from __future__ import annotations

import os

from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import Keys

from vkrt.model.gguf_copy import copy_gguf

ARCH = Keys.General.ARCHITECTURE


def split_groups(names: list[str], n_parts: int) -> list[list[str]]:
    """`names` in `n_parts` consecutive runs, as even as can be."""
    size = -(-len(names) // n_parts)
    return [names[i:i + size] for i in range(0, len(names), size)]


def write_split(src: str | os.PathLike, n_parts: int = 2, *, groups: list[list[str]] | None = None,
                prefix: str | None = None, keys=None) -> list[str]:
    """Write `src` split into parts; returns their paths. `groups`: the tensor names of each part
    (default: `n_parts` even runs). `keys(no, values)` may change the split keys of part `no`
    (a dict of split.no, split.count, split.tensors.count) to make broken splits."""
    src = os.fspath(src)
    reader = GGUFReader(src)
    tensors = {t.name: t for t in reader.tensors}
    groups = groups or split_groups(list(tensors), n_parts)
    prefix = prefix or src.removesuffix(".gguf")
    arch = reader.fields[ARCH].contents()
    paths = []
    for no, group in enumerate(groups):
        path = f"{prefix}-{no + 1:05d}-of-{len(groups):05d}.gguf"
        w = GGUFWriter(path, arch)
        if no == 0:
            for key, field in reader.fields.items():
                if not key.startswith("GGUF.") and key != ARCH:
                    sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
                    w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
        else:
            del w.kv_data[0][ARCH]   # the writer starts every file with it; gguf-split's later parts lack it
        values = {Keys.Split.LLM_KV_SPLIT_NO: no, Keys.Split.LLM_KV_SPLIT_COUNT: len(groups),
                  Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT: len(tensors)}
        if keys is not None:
            keys(no, values)
        for key, value in values.items():
            if value is not None:
                vtype = GGUFValueType.INT32 if key == Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT else GGUFValueType.UINT16
                w.add_key_value(key, value, vtype)
        for name in group:
            t = tensors[name]
            w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name in group:
            w.write_tensor_data(tensors[name].data)
        w.close()
        paths.append(path)
    return paths


def write_split_by_gguf_py(src: str | os.PathLike, out: str | os.PathLike, max_tensors: int) -> None:
    """The same split as gguf-py's own GGUFWriter(split_max_tensors=...) writes it (the reference
    write_split is checked against)."""
    reader = GGUFReader(os.fspath(src))
    copy_gguf(reader, GGUFWriter(os.fspath(out), reader.fields[ARCH].contents(), split_max_tensors=max_tensors))

