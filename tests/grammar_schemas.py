"""Random JSON schemas (objects of string / integer / boolean / enum / array fields, some keys
required) and a checker for exactly that subset, for the constrained-decoding tests."""

from __future__ import annotations

import numpy as np

WORDS = ["red", "green", "blue", "cat", "dog"]


def random_schema(seed: int) -> dict:
    """An object schema with bounded values, so a random model's output ends within a few hundred tokens."""
    rng = np.random.default_rng(seed)
    props = {}
    for i in range(int(rng.integers(1, 5))):
        kind = ["string", "integer", "boolean", "enum", "array"][int(rng.integers(0, 5))]
        if kind == "string":
            props[f"s{i}"] = {"type": "string", "maxLength": 6}
        elif kind == "integer":
            props[f"i{i}"] = {"type": "integer", "minimum": -50, "maximum": 999}
        elif kind == "boolean":
            props[f"b{i}"] = {"type": "boolean"}
        elif kind == "enum":
            props[f"e{i}"] = {"enum": list(rng.choice(WORDS, 3, replace=False))}
        else:
            props[f"a{i}"] = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                              "maxItems": 3}
    names = list(props)
    required = [n for n in names if rng.random() < 0.7] or names[:1]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def check(value, schema: dict) -> None:
    """Assert that `value` fits `schema` (the subset random_schema writes)."""
    if "enum" in schema:
        assert value in schema["enum"], (value, schema)
        return
    kind = schema["type"]
    if kind == "object":
        assert isinstance(value, dict), value
        assert set(schema["required"]) <= value.keys(), (value, schema)
        assert value.keys() <= schema["properties"].keys(), (value, schema)
        for k, v in value.items():
            check(v, schema["properties"][k])
    elif kind == "string":
        assert isinstance(value, str) and len(value) <= schema["maxLength"], value
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
        assert schema["minimum"] <= value <= schema["maximum"], value
    elif kind == "boolean":
        assert isinstance(value, bool), value
    elif kind == "array":
        assert isinstance(value, list) and len(value) <= schema["maxItems"], value
        for v in value:
            check(v, schema["items"])
