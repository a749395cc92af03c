"""Bounds a JSON schema or grammar text must keep before it reaches the grammar compiler
(llguidance): the compiler recurses once per nesting level, $ref followed and rule referenced,
and overflowing its native stack kills the process (an 8 MiB stack died at about 2,200 chained
$refs or 2,500 chained Lark rules). The limits stay far below that and far above real schemas
(OpenAI tool schemas nest under 20 levels)."""

from __future__ import annotations

import json
import math
import re
from urllib.parse import unquote

from ..errors import VkrtError

MAX_SCHEMA_NESTING = 100        # objects and arrays inside one another, as written
MAX_SCHEMA_DEPTH = 256          # the same with every $ref followed (recursion back into itself not counted)
MAX_SCHEMA_NODES = 20_000       # JSON values in one schema
MAX_COUNT = 1_000_000           # minLength, maxItems and the other length and count bounds
MAX_GRAMMAR_BYTES = 128 << 10   # a GBNF / Lark grammar's text
MAX_GRAMMAR_RULES = 2_000
MAX_RULE_DEPTH = 256            # rules reaching rules (recursion back into itself not counted)

_COUNT_KEYWORDS = {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                   "minContains", "maxContains"}
_DATA_KEYWORDS = {"const", "enum", "default", "examples"}   # values, not schemas
_BRANCHES = ("allOf", "anyOf", "oneOf")                    # a schema that is one of these and nothing else


class GrammarError(VkrtError):
    """The constrained-decoding library refused a grammar or schema (its message)."""


class GrammarLimitError(GrammarError):
    """A schema or grammar past one of this module's limits; the message reads after its field's name."""


def check_schema(schema) -> None:
    """Raise GrammarLimitError if `schema` nests, refers or counts past the limits, or holds a
    number JSON cannot carry to the compiler; also if its $refs loop without an object or array
    between (the compiler takes such a schema and then matches nothing)."""
    if not isinstance(schema, (dict, list)):
        return
    _check_values(schema)
    nesting, _ = _longest_path(schema, _children)
    if nesting > MAX_SCHEMA_NESTING:
        raise GrammarLimitError(f"nests {nesting} levels deep (at most {MAX_SCHEMA_NESTING} objects and arrays "
                                "inside one another)")
    depth, _ = _longest_path(schema, lambda node: _children_and_target(schema, node))
    if depth > MAX_SCHEMA_DEPTH:
        raise GrammarLimitError(f"nests {depth} levels deep with its $refs followed (at most {MAX_SCHEMA_DEPTH})")
    looped, walked = None, {}
    for node in _containers(schema):
        if looped is None and id(node) not in walked:
            looped = _longest_path(node, lambda n: _alternatives(schema, n), depth=walked)[1]
    if looped is not None:
        ref = looped.get("$ref") if isinstance(looped, dict) else None
        raise GrammarLimitError(f"has $refs or branches that loop{f' (through {ref!r})' if ref else ''} without an "
                                "object, array or value between")


def check_grammar(text: str) -> None:
    """Raise GrammarLimitError if a GBNF or Lark grammar's text, rule count or rule chain is past
    the limits, or a schema it embeds (`%json {...}`) is."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        raise GrammarLimitError(f"is {size} bytes long (at most {MAX_GRAMMAR_BYTES})")
    text = _without_json(text)
    gbnf = "::=" in text
    rules = _rules(text, gbnf)
    if len(rules) > MAX_GRAMMAR_RULES:
        raise GrammarLimitError(f"has {len(rules)} rules (at most {MAX_GRAMMAR_RULES})")
    depths: dict = {}
    depth = max((_longest_path(name, rules.__getitem__, key=str, depth=depths)[0] for name in rules), default=0)
    if depth > MAX_RULE_DEPTH:
        raise GrammarLimitError(f"chains {depth} rules one through the next (at most {MAX_RULE_DEPTH})")
    endless = _endless_rule(text, gbnf)
    if endless is not None:
        raise GrammarLimitError(f"has a rule that never ends: every way through {endless!r} leads back to it or to "
                                "another such rule (e.g. x ::= \"b\" x), so output reaching it could never finish")


# -- schemas ---------------------------------------------------------------------------------------
def _check_values(schema) -> None:
    """Count the values and check the numbers: 64-bit integers, finite floats, bounded counts."""
    stack = [(schema, "", False)]
    count = 0
    while stack:
        value, where, data = stack.pop()
        count += 1
        if count > MAX_SCHEMA_NODES:
            raise GrammarLimitError(f"holds more than {MAX_SCHEMA_NODES} JSON values")
        if isinstance(value, dict):
            for k, v in value.items():
                at = f"{where}/{k}"
                if not data and k in _COUNT_KEYWORDS and _is_number(v) and v > MAX_COUNT:
                    raise GrammarLimitError(f"has {k} {v} at '{at or '/'}' (at most {MAX_COUNT})")
                stack.append((v, at, data or k in _DATA_KEYWORDS))
        elif isinstance(value, list):
            stack.extend((v, f"{where}/{i}", data) for i, v in enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool) and not -2 ** 63 <= value < 2 ** 64:
            raise GrammarLimitError(f"holds an integer beyond 64 bits at '{where}'")
        elif isinstance(value, float) and not math.isfinite(value):
            raise GrammarLimitError(f"holds a number at '{where}' too large for a double")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _children(node) -> list:
    values = node.values() if isinstance(node, dict) else node
    return [v for v in values if isinstance(v, (dict, list))]


def _children_and_target(root, node) -> list:
    out = _children(node)
    target = _target(root, node.get("$ref")) if isinstance(node, dict) else None
    return out + [target] if target is not None else out


def _containers(schema) -> list:
    """Every object and array in `schema`."""
    out, stack = [], [schema]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(_children(node))
    return out


def _alternatives(root, node) -> list:
    """What a schema may stand for without consuming any text: its $ref's target and branches."""
    if isinstance(node, list):
        return [v for v in node if isinstance(v, dict)]
    out = [node[k] for k in _BRANCHES if isinstance(node.get(k), list)]
    target = _target(root, node.get("$ref"))
    return out + [target] if isinstance(target, dict) else out


def _target(root, ref):
    """The container a local $ref ("#", "#/$defs/x", any JSON pointer) names, or None."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, (dict, list)) else None


def _longest_path(start, successors, key=id, depth: dict | None = None):
    """(the most nodes on a path from `start`, a node an edge loops back to or None). Edges back
    into the path are left out; each node's depth is found once (a walk, not a recursion), kept
    in `depth` (key(node) -> its depth) for the next call."""
    depth = {} if depth is None else depth
    if key(start) in depth:
        return depth[key(start)], None
    best = {key(start): 1}
    path = [(start, iter(successors(start)))]
    looped = None
    while path:
        node, rest = path[-1]
        for child in rest:
            k = key(child)
            if k in best:   # on the path: a loop
                looped = child if looped is None else looped
            elif k in depth:
                best[key(node)] = max(best[key(node)], 1 + depth[k])
            else:
                best[k] = 1
                path.append((child, iter(successors(child))))
                break
        else:
            path.pop()
            k = key(node)
            depth[k] = best.pop(k)
            if path:
                parent = key(path[-1][0])
                best[parent] = max(best[parent], 1 + depth[k])
    return depth[key(start)], looped


# -- grammar text ----------------------------------------------------------------------------------
_LARK_RULE = re.compile(r"^[?!]?([A-Za-z_][A-Za-z0-9_]*)(?:\.-?\d+)?\s*:(?!:)", re.M)
_GBNF_RULE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*::=", re.M)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# comments, strings and character classes (GBNF) or regular expressions (Lark): no rule names in them
_GBNF_OPAQUE = re.compile(r'#[^\n]*|"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]')
_LARK_OPAQUE = re.compile(r'//[^\n]*|"(?:\\.|[^"\\\n])*"i?|\'(?:\\.|[^\'\\\n])*\'|/(?!/)(?:\\.|[^/\\\n])+/[imslux]*'
                          r'|<\[[^\]]*\]>|^%[^\n]*', re.M)


_SPECIAL_TOKEN = re.compile(r"<\|[^|\n]*\|>")   # a special token by name (<|im_end|>): text, as a string is
_BODY_TOKEN = re.compile(r"\x00|%[A-Za-z_]\w*|[A-Za-z_][\w.-]*|\{[\s\d,]*\}|~\s*\d+|[()\[\]|*?]|\S")
_TERMINAL = "\x00"   # what strings, character classes, regular expressions and tokens become


def _endless_rule(text: str, gbnf: bool) -> str | None:
    """The first rule reachable from the start (root, start) that derives no finite text (each
    of its alternatives needs itself or another such rule: `x ::= "b" x`, `x ::= x`), or None.
    llguidance takes such a grammar and then allows no next token once output reaches the rule.
    Constructs not understood here count as text (a grammar is refused only when surely endless)."""
    opaque = _GBNF_OPAQUE if gbnf else _LARK_OPAQUE
    comment = ("#",) if gbnf else ("//", "%")
    text = opaque.sub(lambda m: " " if m.group().startswith(comment) else f" {_TERMINAL} ",
                      _SPECIAL_TOKEN.sub(f" {_TERMINAL} ", text))
    heads = list((_GBNF_RULE if gbnf else _LARK_RULE).finditer(text))
    names = {h.group(1) for h in heads}
    # rule (or a group of one, "rule(2") -> alternatives -> items: (a rule, or None for text; optional)
    rules: dict[str, list[list[tuple[str | None, bool]]]] = {}
    owner: dict[str, str] = {}
    for head, after in zip(heads, heads[1:] + [None]):
        name = head.group(1)
        frames = [(name, rules.setdefault(name, []))]
        frames[0][1].append([])
        tokens = _BODY_TOKEN.findall(text, head.end(), after.start() if after else len(text))
        skip = False
        for tok in tokens:
            alts = frames[-1][1]
            if skip and tok.startswith("{"):   # %regex {...}: its options
                skip = False
                continue
            skip = tok.startswith("%")
            if tok == _TERMINAL or tok.startswith("%") or (tok[0].isalpha() or tok[0] == "_") and tok not in names:
                alts[-1].append((None, False))
            elif tok[0].isalpha() or tok[0] == "_":
                alts[-1].append((tok, False))
            elif tok in "([":
                group = f"{name}({len(rules)}"
                owner[group] = name
                frames.append((group, rules.setdefault(group, [[]])))
                frames[-1][1][0:] = [[]]
            elif tok in ")]" and len(frames) > 1:
                group, _ = frames.pop()
                frames[-1][1][-1].append((group, tok == "]"))
            elif tok == "|":
                alts.append([])
            elif alts[-1] and (tok in "*?" or (tok[0] in "{~" and not tok.strip("{}~ ").split(",")[0].strip(" 0"))):
                alts[-1][-1] = (alts[-1][-1][0], True)   # may be left out: zero repetitions
        while len(frames) > 1:
            group, _ = frames.pop()
            frames[-1][1][-1].append((group, False))
    users: dict[str, set] = {}
    for rule, alts in rules.items():
        for alt in alts:
            for item, optional in alt:
                if item is not None and not optional:
                    users.setdefault(item, set()).add(rule)
    ends, work = set(), list(rules)
    while work:
        rule = work.pop()
        if rule not in ends and any(all(i is None or opt or i in ends for i, opt in alt) for alt in rules[rule]):
            ends.add(rule)
            work.extend(users.get(rule, ()))
    start = "root" if gbnf else "start"
    seen, stack = {start}, [start] if start in rules else []
    while stack:
        rule = stack.pop()
        if rule not in ends:
            return owner.get(rule, rule)
        for alt in rules[rule]:
            for item, _ in alt:
                if item is not None and item not in seen:
                    seen.add(item)
                    stack.append(item)
    return None


def _without_json(text: str) -> str:
    """The grammar with each `%json {schema}` checked (check_schema) and cut out."""
    decoder = json.JSONDecoder()
    out, at = [], 0
    while (i := text.find("%json", at)) >= 0:
        start = i + len("%json")
        while start < len(text) and text[start].isspace():
            start += 1
        try:
            schema, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            out.append(text[at:start])
            at = start
            continue
        try:
            check_schema(schema)
        except GrammarLimitError as exc:
            raise GrammarLimitError(f"has a %json schema that {exc}") from None
        out.append(text[at:i])
        at = end
    return "".join(out) + text[at:]


def _rules(text: str, gbnf: bool) -> dict[str, list[str]]:
    """Each rule's name -> the names of the rules and terminals its body refers to."""
    text = (_GBNF_OPAQUE if gbnf else _LARK_OPAQUE).sub(" ", text)
    heads = list((_GBNF_RULE if gbnf else _LARK_RULE).finditer(text))
    bodies = {}
    for head, after in zip(heads, heads[1:] + [None]):
        body = text[head.end():after.start() if after else len(text)]
        bodies.setdefault(head.group(1), []).extend(_NAME.findall(body))
    return {name: [n for n in refs if n in bodies] for name, refs in bodies.items()}
