"""Push-constant layouts, defined once in Python and checked against the shader's block."""

from __future__ import annotations

import re
import struct

from ..errors import KernelInterfaceError

MAX_PUSH_BYTES = 128  # the minimum every Vulkan device guarantees

# type -> (struct code, count, size, alignment) under std430 rules
_TYPES = {
    "u32": ("I", 1, 4, 4), "i32": ("i", 1, 4, 4), "f32": ("f", 1, 4, 4),
    "uvec2": ("I", 2, 8, 8), "ivec2": ("i", 2, 8, 8), "vec2": ("f", 2, 8, 8),
    "uvec4": ("I", 4, 16, 16), "ivec4": ("i", 4, 16, 16), "vec4": ("f", 4, 16, 16),
}
_ARRAY = re.compile(r"^(u32|i32|f32)\[(\d+)\]$")


class PushConstants:
    """An ordered list of (name, type) fields: 'u32', 'i32', 'f32', 'uvec2/4', 'ivec2/4', 'vec2/4',
    or a scalar array 'u32[N]'. pack(**values) gives the bytes to push."""

    def __init__(self, *fields: tuple[str, str]):
        self.fields = tuple(fields)
        fmt = "<"
        offset = 0
        self.members: list[tuple[str, int, int, int]] = []  # name, offset, size, count
        for name, typ in fields:
            m = _ARRAY.match(typ)
            if m:
                code, count, size, align = _TYPES[m.group(1)][0], int(m.group(2)), 4 * int(m.group(2)), 4
            elif typ in _TYPES:
                code, count, size, align = _TYPES[typ]
            else:
                raise KernelInterfaceError(f"push constant {name!r}: unknown type {typ!r}")
            pad = -offset % align
            fmt += "x" * pad + f"{count}{code}"
            offset += pad
            self.members.append((name, offset, size, count))
            offset += size
        self.size = offset
        self._struct = struct.Struct(fmt)
        if self.size > MAX_PUSH_BYTES:
            raise KernelInterfaceError(f"push constants take {self.size} bytes; at most {MAX_PUSH_BYTES} are portable")

    def __hash__(self):
        return hash(self.fields)

    def __eq__(self, other):
        return isinstance(other, PushConstants) and other.fields == self.fields

    def __repr__(self):
        return f"PushConstants({', '.join(f'{n}: {t}' for n, t in self.fields)})"

    def pack(self, values: dict | None = None, **kw) -> bytes:
        values = {**(values or {}), **kw}
        names = {name for name, *_ in self.members}
        unknown = set(values) - names
        if unknown:
            raise KernelInterfaceError(f"unknown push constant(s) {sorted(unknown)}; layout is {self!r}")
        flat = []
        for name, _, _, count in self.members:
            if name not in values:
                raise KernelInterfaceError(f"push constant {name!r} has no value; layout is {self!r}")
            v = values[name]
            if count == 1:
                flat.append(v)
            else:
                v = list(v)
                if len(v) != count:
                    raise KernelInterfaceError(f"push constant {name!r} needs {count} values, got {len(v)}")
                flat.extend(v)
        try:
            return self._struct.pack(*flat)
        except struct.error as exc:
            raise KernelInterfaceError(f"push constants {values}: {exc} (layout {self!r})") from None

    def check(self, iface, shader: str) -> None:
        """Raise KernelInterfaceError unless the shader's push block has exactly these members."""
        theirs = [(m.name, m.offset, m.size) for m in iface.push_members]
        ours = [(name, off, size) for name, off, size, _ in self.members]
        if iface.push_size != self.size or theirs != ours:
            raise KernelInterfaceError(
                f"push-constant layout of {shader} disagrees with Python: shader block is {iface.push_size} bytes "
                f"{theirs}, Python layout is {self.size} bytes {ours}")
