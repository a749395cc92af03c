"""Request bodies of more than WORKER_BYTES are parsed in a sandbox worker, not in the server:
json.loads holds the GIL for the whole parse (about 55 ns a token id: 110 ms for 2,000,000), and
the scheduler thread, which every stream waits on, needs it between GPU steps. The worker sends the
body back with its long lists of numbers packed as machine arrays (unpacking 2,000,000 ids takes
a tenth of parsing them), and refuses a body of more than MAX_VALUES other JSON values, which no
packing makes cheap to rebuild here."""

from __future__ import annotations

from array import array

from .validation import BadRequest, parse_json_object

WORKER_BYTES = 256 << 10   # a body larger than this is parsed in a sandbox worker
PACK_MIN = 64              # a list of this many numbers of one kind or more travels packed
MAX_VALUES = 1 << 17       # JSON values outside packed lists a worker-parsed body may hold
SLOWEST_BYTES_PER_SECOND = 1 << 20   # a worker's parse may take a second a MiB (the 10 s limit at least)
_CODES = {int: "q", float: "d"}


def parse_packed(raw: bytes) -> tuple[dict, bytes]:
    """(info, packed bytes) for `raw`, a request body: info["body"] is the body with each long
    list of integers (int64) or of floats set to null, info["packed"] a [path, typecode, length]
    for each, in the order their bytes follow one another in the packed bytes."""
    body = parse_json_object(raw)
    packed, chunks = [], []
    values = 0
    stack: list[tuple[object, tuple]] = [(body, ())]
    while stack:
        node, path = stack.pop()
        values += len(node)
        if values > MAX_VALUES:
            raise BadRequest(f"the request body holds more than {MAX_VALUES} JSON values outside lists of numbers; "
                             f"vkrt takes at most that many")
        for key, value in (node.items() if type(node) is dict else enumerate(node)):
            if type(value) is dict:
                stack.append((value, path + (key,)))
            elif type(value) is list:
                numbers = _packed(value)
                if numbers is None:
                    stack.append((value, path + (key,)))
                else:
                    node[key] = None
                    packed.append([[*path, key], numbers.typecode, len(value)])
                    chunks.append(numbers.tobytes())
    return {"body": body, "packed": packed}, b"".join(chunks)


def _packed(values: list) -> array | None:
    """`values` as an array when they are PACK_MIN or more integers in int64, or floats."""
    if len(values) < PACK_MIN:
        return None
    kinds = set(map(type, values))
    code = _CODES.get(kinds.pop()) if len(kinds) == 1 else None
    if code is None:
        return None
    try:
        return array(code, values)
    except OverflowError:   # an integer past int64 travels as JSON
        return None


def unpack(info: dict, data: bytes) -> dict:
    """The body parse_packed read, its lists of numbers restored."""
    body, offset = info["body"], 0
    for path, code, n in info["packed"]:
        numbers = array(code)
        end = offset + n * numbers.itemsize
        numbers.frombytes(data[offset:end])
        offset = end
        node = body
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = numbers.tolist()
    return body
