"""The hostile corpus of bench/server_abuse.py, and the GGUF copy with a trap chat template.

The trap template is the model's own unless the last message holds a trigger word:
TRAP_LOOP (three nested range(100000) loops: for ever), TRAP_MEMORY (a string doubled by `+` in a
namespace until it is --trap-mib MiB) or TRAP_OUTPUT (100 MB of text)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from vkrt.model.gguf_copy import ARCH, copy_gguf
from vkrt.server.chat_template import CHATML

CHAT, COMPLETION = "/v1/chat/completions", "/completion"
TRIGGERS = ("TRAP_LOOP", "TRAP_MEMORY", "TRAP_OUTPUT")
# FIM token ids for the copy, so that /infill serves: these pieces where the vocabulary has them
# (SmolLM2's), else its last three tokens (a generated model's vocabulary has no FIM pieces)
FIM = {"fim_pre": "<repo_name>", "fim_suf": "<reponame>", "fim_mid": "<file_sep>"}


def trap_template(original: str, mib: int = 2048) -> str:
    doublings = max(1, (mib << 20).bit_length() - 11)   # 1 KiB doubled: mib MiB
    loop = "{%- for i in range(100000) -%}" * 3 + "{%- endfor -%}" * 3
    return ("{%- set last = messages[-1]['content'] if messages[-1]['content'] is string else '' -%}"
            "{%- if 'TRAP_LOOP' in last -%}" + loop +
            "{%- elif 'TRAP_MEMORY' in last -%}{%- set ns = namespace(s='" + "x" * 1024 + "') -%}"
            "{%- for i in range(" + str(doublings) + ") -%}{%- set ns.s = ns.s + ns.s -%}{%- endfor -%}"
            "{{ ns.s | length }}"
            "{%- elif 'TRAP_OUTPUT' in last -%}{%- for i in range(100000) -%}{{ 'x' * 1000 }}{%- endfor -%}"
            "{%- endif -%}" + original)


def write_trap_copy(src: str, dst: str, mib: int = 2048) -> int:
    """Copy `src` to `dst` with the trap chat template (and FIM token ids); returns the vocabulary size."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    ids = {name: tokens.index(piece) for name, piece in FIM.items() if piece in tokens}
    if len(ids) < len(FIM):
        ids = dict(zip(FIM, range(len(tokens) - len(FIM), len(tokens))))
    extra = {f"tokenizer.ggml.{name}_token_id": (i, GGUFValueType.UINT32) for name, i in ids.items()
             if f"tokenizer.ggml.{name}_token_id" not in reader.fields}
    if "tokenizer.chat_template" not in reader.fields:
        extra["tokenizer.chat_template"] = (trap_template(CHATML, mib), GGUFValueType.STRING)
    copy_gguf(reader, GGUFWriter(dst, reader.fields[ARCH].contents()),
              lambda key, value: trap_template(value, mib) if key == "tokenizer.chat_template" else value, extra)
    return len(tokens)



@dataclass
class Case:
    name: str
    path: str
    body: bytes
    content_type: str | None = "application/json"
    raw_head: str | None = None   # send these headers as they are (a false Content-Length, no Content-Type)
    trap: bool = False            # runs the trap template: sent last


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


def _raw(body: dict, key: str, raw: str) -> bytes:
    """body's JSON with `key` set to raw JSON text (what json.dumps cannot write: 1e400, 100,000 levels)."""
    text = json.dumps({**body, key: None})
    assert text.endswith(f'"{key}": null}}')
    return (text[:-len("null}")] + raw + "}").encode()


def _chat(content="Say hi.", **extra) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _comp(**extra) -> dict:
    return {"prompt": "Say hi.", "n_predict": 4, **extra}


def ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n - 1)}
    defs[f"d{n - 1}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def corpus(vocab: int) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    for n in (5000, 30000):   # $ref chains in every place a schema goes
        s, k = ref_chain(n), f"{n // 1000}k"
        add(Case(f"$ref chain {k}: chat json_schema", CHAT, _j(_chat(json_schema=s))))
        add(Case(f"$ref chain {k}: response_format", CHAT,
                 _j(_chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": s}}))))
        tool = {"type": "function", "function": {"name": "f", "parameters": s, "strict": True}}
        add(Case(f"$ref chain {k}: tool parameters", CHAT, _j(_chat(tools=[tool], tool_choice="required"))))
        add(Case(f"$ref chain {k}: /completion json_schema", COMPLETION, _j(_comp(json_schema=s))))
    rules = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(4999)) + 'r4999 ::= "a"\n'
    add(Case(f"GBNF chain of 5000 rules ({len(rules) // 1000} KB)", COMPLETION, _j(_comp(grammar=rules))))
    add(Case("GBNF 100000 nested parentheses", COMPLETION, _j(_comp(grammar="root ::= " + "(" * 100000 + '"a"' +
                                                                     ")" * 100000))))
    cyc = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
    for label, s in (("cyclic $defs a->b->a", cyc), ('{"$ref": "#"}', {"$ref": "#"}), ("json_schema false", False),
                     ("maxItems -5", {"type": "array", "maxItems": -5}),
                     ("minLength 1e300", {"type": "string", "minLength": 1e300}),
                     ("pattern '(a|'", {"type": "string", "pattern": "(a|"}),
                     ("pattern '(?<=x)'", {"type": "string", "pattern": "(?<=x)"}),
                     ("pattern 'a{99999999}'", {"type": "string", "pattern": "a{99999999}"}),
                     ("enum of 100000 strings", {"enum": [f"value{i}" for i in range(100000)]})):
        add(Case(f"schema {label}", CHAT, _j(_chat(json_schema=s))))
    add(Case("schema minimum 1e400 (raw)", CHAT, _raw(_chat(), "json_schema", '{"type": "number", "minimum": 1e400}')))
    ids = "[" + ",".join(["1"] * 2_000_000) + "]"
    add(Case("/detokenize 2,000,000 ids", "/detokenize", _raw({}, "tokens", ids)))
    add(Case("/completion prompt of 2,000,000 ids", COMPLETION, _raw({"n_predict": 4}, "prompt", ids)))
    add(Case("/detokenize ids out of vocabulary", "/detokenize", _j({"tokens": [vocab, -1, 2 ** 70]})))
    add(Case("/completion ids out of vocabulary", COMPLETION, _j(_comp(prompt=[1, vocab + 5]))))
    add(Case("/detokenize float and string ids", "/detokenize", _j({"tokens": [1.5, "2", None]})))
    add(Case("/completion float and string ids", COMPLETION, _j(_comp(prompt=[1, 2.5, "3"]))))
    text = "The quick brown fox jumps over the lazy dog. " * 140_000   # ~6.3 MB
    add(Case("/tokenize 6 MB", "/tokenize", _j({"content": text})))
    add(Case("/tokenize 6 MB with_pieces", "/tokenize", _j({"content": text, "with_pieces": True})))
    add(Case("7 MB unknown field 'junk'", CHAT, _j(_chat(junk="x" * 7_000_000))))
    add(Case("JSON array nested 100000 deep", CHAT, _raw(_chat(), "junk", "[" * 100000 + "]" * 100000)))
    add(Case("JSON number of 100000 digits", CHAT, _raw({"messages": _chat()["messages"]}, "max_tokens", "9" * 100000)))
    for label, bias in (("key Arabic digits", {"١٢": 1}), ("key '1e5'", {"1e5": 1}),
                        ("key of 5000 digits", {"9" * 5000: 1})):
        add(Case(f"logit_bias {label}", CHAT, _j(_chat(logit_bias=bias))))
    add(Case("logit_bias bias 1e400 (raw)", CHAT, _raw(_chat(), "logit_bias", '{"1": 1e400}')))
    args = json.dumps("[" * 100000 + "]" * 100000)
    call = '[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ' + args + "}}]"
    msgs = ('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": ' + call +
            '}, {"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "user", "content": "and?"}]')
    add(Case("tool-call arguments nested 100000 deep", CHAT, _raw({"max_tokens": 4}, "messages", msgs)))
    small = _j(_chat())
    add(Case("POST without Content-Type", CHAT, small, None))
    add(Case("Content-Type text/plain", CHAT, small, "text/plain"))
    add(Case("Content-Length 10000000000, small body", CHAT, small, raw_head=(
        f"POST {CHAT} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 10000000000")))
    add(Case("/v1/embeddings 100000 inputs", "/v1/embeddings", _j({"input": ["hi"] * 100000})))
    extra = [{"filename": f"f{i}.py", "text": "x = 1\n" * 1000} for i in range(1000)]   # ~6 MB
    add(Case("/infill input_extra 6 MB", "/infill", _j({"input_prefix": "def f(", "input_suffix": ")\n",
                                                         "input_extra": extra, "n_predict": 4})))
    add(Case("n 1000", CHAT, _j(_chat(n=1000))))
    add(Case("max_tokens 1e20", CHAT, _j(_chat(max_tokens=1e20))))
    add(Case("stop of 10000 strings", CHAT, _j(_chat(stop=[f"s{i}" for i in range(10000)]))))
    add(Case("messages of 100000 entries", CHAT,
             _j({"messages": [{"role": "user", "content": f"m{i}"} for i in range(100000)], "max_tokens": 4})))
    for trig in TRIGGERS:
        add(Case(f"/apply-template {trig}", "/apply-template", _j(_chat(trig)), trap=True))
        add(Case(f"chat {trig}", CHAT, _j(_chat(trig)), trap=True))
    return cases
