"""Static counts of a GCN kernel's loops from RADV's "Assembly" representation (ACO's disassembly:
labels `BBn:`, one instruction a tab-indented line).

A loop is the span a backward branch closes (`s_branch` / `s_cbranch_*` to an earlier label); an
inner loop's span lies inside its outer one's. The counts are of the instructions in a span, once
each: one trip through every path, an upper bound of a trip through any one (branches past blocks
inside it count too), and an inner loop's body once however often it runs.

The main loop is the longest. That is the KV loop of an attention kernel, except where a
quantised cache's decode does norm_rope's work: its prologue's rotation loop is longer. No rule
tried picked the KV loop everywhere: the most multiply-adds picks the split merge's loop at head
64, and weighing conversions in picks the prologue's loop again. `loops` lists every loop, for
a reader who knows which one to look at. bench/gcn_shader_stats.py --loop prints them beside the
compiler's statistics.
"""

from __future__ import annotations

import re

_LABEL = re.compile(r"^(BB\d+):")
_BRANCH = re.compile(r"\bs_c?branch\w*\s+(BB\d+)")

# instruction classes: name -> predicate on the mnemonic
CLASSES = {
    "valu": lambda m: m.startswith("v_"),
    "fma": lambda m: m in ("v_mac_f32_e32", "v_mac_f32_e64", "v_mad_f32", "v_fma_f32", "v_fmac_f32_e32",
                           "v_fmac_f32_e64", "v_mac_legacy_f32_e32", "v_mad_legacy_f32"),
    "cvt": lambda m: m.startswith("v_cvt_"),
    "mov": lambda m: m.startswith("v_mov_b32"),
    "lds": lambda m: m.startswith("ds_"),
    "vmem": lambda m: m.startswith(("buffer_", "global_", "flat_")),
    "waitcnt": lambda m: m == "s_waitcnt",
}


def counts(body: list[str]) -> dict[str, int]:
    """{"instructions": n, and a count a CLASSES entry} of a list of mnemonics."""
    return {"instructions": len(body), **{name: sum(1 for m in body if test(m)) for name, test in CLASSES.items()}}


def loops(asm: str) -> list[dict]:
    """Every loop, in the order its backward branch appears: {"label": its first block, and counts()}."""
    lines = asm.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    found = []
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            body = [x.split()[0] for x in lines[labels[m.group(1)]:i + 1] if x.startswith("\t") and x.strip()]
            found.append({"label": m.group(1), **counts(body)})
    return found


def loop_counts(asm: str) -> dict[str, int] | None:
    """The main (longest) loop's counts() (None: the kernel has no loop)."""
    found = loops(asm)
    if not found:
        return None
    main = max(found, key=lambda loop: loop["instructions"])
    return {k: v for k, v in main.items() if k != "label"}
