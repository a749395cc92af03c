"""Just enough SPIR-V reflection to check a kernel's Python description against its shader:
push-constant block, storage-buffer bindings (and whether each is read-only / write-only),
specialisation constants, workgroup size, and shared-memory use."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..errors import KernelInterfaceError

MAGIC = 0x07230203

OP_NAME, OP_MEMBER_NAME, OP_EXECUTION_MODE = 5, 6, 16
OP_TYPE_BOOL, OP_TYPE_INT, OP_TYPE_FLOAT, OP_TYPE_VECTOR, OP_TYPE_MATRIX = 20, 21, 22, 23, 24
OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY, OP_TYPE_STRUCT, OP_TYPE_POINTER = 28, 29, 30, 32
OP_CONSTANT, OP_SPEC_CONSTANT_TRUE, OP_SPEC_CONSTANT_FALSE, OP_SPEC_CONSTANT = 43, 48, 49, 50
OP_SPEC_CONSTANT_COMPOSITE, OP_VARIABLE, OP_DECORATE, OP_MEMBER_DECORATE = 51, 59, 71, 72
OP_EXECUTION_MODE_ID = 331

DEC_SPEC_ID, DEC_BLOCK, DEC_BUFFER_BLOCK, DEC_ARRAY_STRIDE = 1, 2, 3, 6
DEC_BUILTIN, DEC_NON_WRITABLE, DEC_NON_READABLE, DEC_BINDING, DEC_SET, DEC_OFFSET = 11, 24, 25, 33, 34, 35
BUILTIN_WORKGROUP_SIZE = 25
MODE_LOCAL_SIZE, MODE_LOCAL_SIZE_ID = 17, 38
SC_UNIFORM, SC_WORKGROUP, SC_PUSH_CONSTANT, SC_STORAGE_BUFFER = 2, 4, 9, 12


@dataclass(frozen=True)
class Member:
    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class Binding:
    set: int
    binding: int
    name: str
    readonly: bool
    writeonly: bool


@dataclass
class ShaderInterface:
    push_size: int = 0
    push_members: list[Member] = field(default_factory=list)
    bindings: dict[int, Binding] = field(default_factory=dict)      # set 0's, by binding
    other_sets: list[Binding] = field(default_factory=list)
    spec_constants: dict[int, str] = field(default_factory=dict)   # SpecId -> 'int' | 'uint' | 'float' | 'bool'
    local_size: tuple[int, int, int] = (1, 1, 1)
    local_size_spec_ids: tuple[int | None, int | None, int | None] = (None, None, None)
    shared_bytes: int = 0


def _string(words: list[int]) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def reflect(spirv: bytes) -> ShaderInterface:
    if len(spirv) % 4 or len(spirv) < 20:
        raise KernelInterfaceError(f"not a SPIR-V module ({len(spirv)} bytes)")
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    if words[0] != MAGIC:
        raise KernelInterfaceError("not a SPIR-V module (bad magic)")
    names: dict[int, str] = {}
    member_names: dict[tuple[int, int], str] = {}
    decorations: dict[int, dict[int, list[int]]] = {}
    member_decorations: dict[tuple[int, int], dict[int, list[int]]] = {}
    types: dict[int, tuple] = {}
    constants: dict[int, int] = {}
    spec_ids: dict[int, int] = {}
    variables: list[tuple[int, int, int]] = []  # (pointer type, id, storage class)
    modes: dict[int, list[int]] = {}
    spec_composites: dict[int, list[int]] = {}

    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise KernelInterfaceError("corrupt SPIR-V (zero-length instruction)")
        a = words[i + 1:i + count]
        if op == OP_NAME:
            names[a[0]] = _string(list(a[1:]))
        elif op == OP_MEMBER_NAME:
            member_names[(a[0], a[1])] = _string(list(a[2:]))
        elif op == OP_DECORATE:
            decorations.setdefault(a[0], {})[a[1]] = list(a[2:])
        elif op == OP_MEMBER_DECORATE:
            member_decorations.setdefault((a[0], a[1]), {})[a[2]] = list(a[3:])
        elif op in (OP_TYPE_BOOL, OP_TYPE_INT, OP_TYPE_FLOAT, OP_TYPE_VECTOR, OP_TYPE_MATRIX, OP_TYPE_ARRAY,
                    OP_TYPE_RUNTIME_ARRAY, OP_TYPE_STRUCT, OP_TYPE_POINTER):
            types[a[0]] = (op, *a[1:])
        elif op == OP_CONSTANT:
            constants[a[1]] = a[2]
        elif op in (OP_SPEC_CONSTANT, OP_SPEC_CONSTANT_TRUE, OP_SPEC_CONSTANT_FALSE):
            spec_ids[a[1]] = a[0]  # result id -> type id
            constants[a[1]] = a[2] if op == OP_SPEC_CONSTANT else int(op == OP_SPEC_CONSTANT_TRUE)
        elif op == OP_SPEC_CONSTANT_COMPOSITE:
            spec_composites[a[1]] = list(a[2:])
        elif op == OP_VARIABLE:
            variables.append((a[0], a[1], a[2]))
        elif op in (OP_EXECUTION_MODE, OP_EXECUTION_MODE_ID):
            modes[a[1]] = list(a[2:])
        i += count

    def size_of(tid: int) -> int:
        t = types[tid]
        kind = t[0]
        if kind in (OP_TYPE_INT, OP_TYPE_FLOAT):
            return t[1] // 8
        if kind == OP_TYPE_BOOL:
            return 4
        if kind in (OP_TYPE_VECTOR, OP_TYPE_MATRIX):
            return size_of(t[1]) * t[2]
        if kind == OP_TYPE_ARRAY:
            stride = decorations.get(tid, {}).get(DEC_ARRAY_STRIDE, [size_of(t[1])])[0]
            return stride * constants[t[2]]
        if kind == OP_TYPE_RUNTIME_ARRAY:
            return 0
        if kind == OP_TYPE_STRUCT:
            end = 0
            for m, mt in enumerate(t[1:]):
                off = member_decorations.get((tid, m), {}).get(DEC_OFFSET, [end])[0]
                end = max(end, off + size_of(mt))
            return end
        raise KernelInterfaceError(f"unsupported SPIR-V type op {kind}")

    def scalar_name(tid: int) -> str:
        t = types[tid]
        if t[0] == OP_TYPE_BOOL:
            return "bool"
        if t[0] == OP_TYPE_FLOAT:
            return "float"
        return "int" if t[2] else "uint"

    iface = ShaderInterface()
    for ptr_type, var, storage in variables:
        pointee = types[ptr_type][2]
        if storage == SC_PUSH_CONSTANT:
            members = types[pointee][1:]
            iface.push_size = size_of(pointee)
            iface.push_members = [
                Member(member_names.get((pointee, m), f"m{m}"),
                       member_decorations.get((pointee, m), {}).get(DEC_OFFSET, [0])[0], size_of(mt))
                for m, mt in enumerate(members)]
        elif storage in (SC_STORAGE_BUFFER, SC_UNIFORM):
            dec = decorations.get(var, {})
            if DEC_BINDING not in dec:
                continue
            n_members = len(types[pointee]) - 1
            mdec = [member_decorations.get((pointee, m), {}) for m in range(n_members)]
            readonly = DEC_NON_WRITABLE in dec or (n_members > 0 and all(DEC_NON_WRITABLE in d for d in mdec))
            writeonly = DEC_NON_READABLE in dec or (n_members > 0 and all(DEC_NON_READABLE in d for d in mdec))
            b = Binding(dec.get(DEC_SET, [0])[0], dec[DEC_BINDING][0], names.get(pointee, names.get(var, "")),
                        readonly, writeonly)
            if b.set == 0:
                iface.bindings[b.binding] = b
            else:
                iface.other_sets.append(b)
        elif storage == SC_WORKGROUP:
            iface.shared_bytes += size_of(pointee)

    for cid, tid in spec_ids.items():
        if DEC_SPEC_ID in decorations.get(cid, {}):
            iface.spec_constants[decorations[cid][DEC_SPEC_ID][0]] = scalar_name(tid)

    size = [1, 1, 1]
    size_ids: list[int | None] = [None, None, None]
    for mode, args in modes.items():
        if mode == MODE_LOCAL_SIZE:
            size = list(args[:3])
        elif mode == MODE_LOCAL_SIZE_ID:
            for axis, cid in enumerate(args[:3]):
                size[axis] = constants.get(cid, 1)
                size_ids[axis] = decorations.get(cid, {}).get(DEC_SPEC_ID, [None])[0]
    for cid, parts in spec_composites.items():
        if decorations.get(cid, {}).get(DEC_BUILTIN) == [BUILTIN_WORKGROUP_SIZE]:
            for axis, part in enumerate(parts[:3]):
                size[axis] = constants.get(part, 1)
                size_ids[axis] = decorations.get(part, {}).get(DEC_SPEC_ID, [None])[0]
    iface.local_size = tuple(size)
    iface.local_size_spec_ids = tuple(size_ids)
    return iface
