"""A GGUF file written again through gguf-py's writer with some metadata changed or added: the
variants of a model that tests and benches make (a split, another chat template)."""

from __future__ import annotations

from typing import Callable

from gguf import GGUFReader, GGUFValueType, GGUFWriter

ARCH = "general.architecture"


def copy_gguf(reader: GGUFReader, writer: GGUFWriter, change: Callable[[str, object], object] = lambda k, v: v,
              extra: dict[str, tuple[object, GGUFValueType]] | None = None) -> None:
    """Every key of `reader` (its value through change(key, value)), then `extra` (key -> (value,
    type)), then every tensor, written to `writer` (made with the reader's architecture), which
    is closed."""
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == ARCH:
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, change(key, field.contents()), field.types[0], sub_type=sub)
    for key, (value, vtype) in (extra or {}).items():
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
