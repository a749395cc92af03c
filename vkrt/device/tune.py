"""Tuning overrides (VKRT_TUNE, the bench scripts' --set): fields of the tuning table set by name
for one run, so a kernel variant can be tried on a card without editing the table.

    VKRT_TUNE="fa_loads_first=3 mv_rows_by_type=Q3_K:2+Q4_K:2+Q5_K:2+Q6_K:2"

Items are FIELD=VALUE, split by commas or spaces. Numbers are whole and not negative; switches
take 1/0 (on/off, true/false, yes/no); type lists join weight type names with '+' (`Q5_K+Q6_K`,
`none` for an empty one), and the `*_by_type` fields pair each with a count (`Q4_K:2`), the
`*_by_head` ones a head size (`128:2`); the LOADS_FIRST fields take 0 to 3.
The values are applied to the table's entry before the device limits it (tuning_for): a value
the device cannot honour is an error naming the value it would get, never silently changed.
"""

from __future__ import annotations

import dataclasses
import difflib

import gguf

from ..errors import TuningOverrideError
from ..settings import FLAG_OFF, FLAG_ON
from .profile import DeviceProfile
from .tuning import TABLE, Tuning

# fields that their own variable sets
SET_ELSEWHERE = {"arch": "VKRT_ARCH", "mm_coopmat": "VKRT_COOPMAT", "fa_coopmat": "VKRT_COOPMAT"}
# a field that is derived from another when that one is non-zero: setting it alone zeroes the other
# (the field as written, which is what its 0 means)
DERIVED_FROM = {"fa_fill_groups": "fa_fill_per_cu", "mm_split_groups": "mm_split_fill_per_cu"}
TYPE_PAIRS = ("fa_loads_first_by_type", "fa_pack_rows_by_type", "mv_rows_by_type", "mv_rows_one_column_by_type")
HEAD_PAIRS = ("fa_prologue_pack_rows_by_head", "fa_pack_rows_by_head", "fa_quant_decode_d_split_by_head",
              "fa_quant_decode_rows_by_head", "fa_prompt_wg_by_head")   # (head size, count) pairs
# fields whose values (a pair's count) name one of a few kernel layouts: the largest each takes
LARGEST = {"fa_loads_first": 3, "fa_loads_first_by_type": 3}


def _fields() -> dict[str, str]:
    return {f.name: f.type for f in dataclasses.fields(Tuning)}


def _type_name(source: str, item: str, name: str) -> str:
    if name not in gguf.GGMLQuantizationType.__members__:
        raise TuningOverrideError(f"{source}: {item!r}: {name!r} is not a GGUF weight type (e.g. Q4_K, Q6_K, IQ4_XS)")
    return name


def _head_pair(source: str, item: str, field: str, pair: str) -> tuple[int, int]:
    head, sep, count = pair.partition(":")
    if not sep or not head.isdigit() or not count.isdigit() or int(count) < 1:
        raise TuningOverrideError(f"{source}: {item!r}: {field} takes HEAD:COUNT pairs joined by '+' "
                                  f"(e.g. 128:2), got {pair!r}")
    return int(head), int(count)


def _within(source: str, item: str, field: str, value: int) -> None:
    if field in LARGEST and value > LARGEST[field]:
        raise TuningOverrideError(f"{source}: {item!r}: {field} takes 0 to {LARGEST[field]} (the kernel's "
                                  f"LOADS_FIRST layouts), got {value}")


def _value(source: str, item: str, field: str, kind: str, text: str):
    if kind == "bool":
        if text.lower() not in FLAG_ON + FLAG_OFF:
            raise TuningOverrideError(f"{source}: {item!r}: {field} is a switch; expected 1 or 0 (on/off)")
        return text.lower() in FLAG_ON
    if kind == "int":
        if not text.isdigit():
            raise TuningOverrideError(f"{source}: {item!r}: {field} takes a whole number of at least 0")
        _within(source, item, field, int(text))
        return int(text)
    if kind == "tuple":
        names = () if text.lower() in ("", "none") else tuple(text.split("+"))
        if field in HEAD_PAIRS:
            return tuple(_head_pair(source, item, field, pair) for pair in names)
        if field not in TYPE_PAIRS:
            return tuple(_type_name(source, item, n) for n in names)
        pairs = []
        for pair in names:
            name, sep, count = pair.partition(":")
            if not sep or not count.isdigit() or int(count) < (0 if field in LARGEST else 1):
                raise TuningOverrideError(f"{source}: {item!r}: {field} takes TYPE:COUNT pairs joined by '+' "
                                          f"(e.g. Q4_K:2+Q6_K:2), got {pair!r}")
            _within(source, item, field, int(count))
            pairs.append((_type_name(source, item, name), int(count)))
        return tuple(pairs)
    raise TuningOverrideError(f"{source}: {item!r}: {field} cannot be set from text")


def parse_tune(text: str, source: str = "VKRT_TUNE") -> tuple[tuple[str, object], ...]:
    """The (field, value) pairs of `text` (module docstring); a TuningOverrideError naming `source`, the
    item and what was expected where one is not a tuning field or its value does not parse. A
    field named twice keeps its last value."""
    fields = _fields()
    changes: dict[str, object] = {}
    for item in text.replace(",", " ").split():
        field, sep, value = item.partition("=")
        if not sep:
            raise TuningOverrideError(f"{source}: {item!r} is not FIELD=VALUE")
        if field in SET_ELSEWHERE:
            raise TuningOverrideError(f"{source}: {field} is set by {SET_ELSEWHERE[field]}, not here")
        if field not in fields:
            near = difflib.get_close_matches(field, fields, n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else " (vkrt/device/tuning.py lists them)"
            raise TuningOverrideError(f"{source}: {field!r} is not a tuning field{hint}")
        changes[field] = _value(source, item, field, fields[field], value)
    return tuple(changes.items())


def tuning_for(profile: DeviceProfile, coopmat: bool | None = None,
               changes: tuple[tuple[str, object], ...] = ()) -> Tuning:
    """The device's tuning: its architecture's table entry, with `changes` (parse_tune's pairs)
    set, limited by what the device can do (Tuning.resolved; `coopmat` is VKRT_COOPMAT). A field
    derived from a per-CU count that is set alone has that count zeroed (DERIVED_FROM). A
    TuningOverrideError where the result does not hold a value asked for (the device limits it,
    or another field replaces it)."""
    values = dict(changes)
    for derived, per_cu in DERIVED_FROM.items():
        if derived in values and per_cu not in values:
            values[per_cu] = 0
    resolved = dataclasses.replace(TABLE[profile.architecture], **values).resolved(profile, coopmat)
    for field, value in changes:
        got = getattr(resolved, field)
        if got != value:
            held = describe_tune(((field, got),)).partition("=")[2]
            raise TuningOverrideError(f"VKRT_TUNE: {describe_tune(((field, value),))} cannot be honoured on "
                                      f"{profile.name}: its tuning resolves it to {held} (the device's limits, or "
                                      "another field that sets it)")
    return resolved


def describe_tune(changes: tuple[tuple[str, object], ...]) -> str:
    """`changes` written back as VKRT_TUNE text (for logs and reports)."""
    def text(value) -> str:
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, tuple):
            return "+".join(f"{v[0]}:{v[1]}" if isinstance(v, tuple) else str(v) for v in value) or "none"
        return str(value)
    return " ".join(f"{field}={text(value)}" for field, value in changes)
