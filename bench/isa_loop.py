"""Static counts of a GCN kernel's main loop from RADV's "Assembly" representation (ACO's
disassembly: labels `BBn:`, one instruction a tab-indented line).

The main loop is the longest span a backward branch closes (`s_branch` / `s_cbranch_*` to an
earlier label). The counts are of the instructions in it, once each: one trip through every
path, an upper bound of a trip through any one (branches past blocks inside it are counted too).
bench/gcn_shader_stats.py --loop prints them beside the compiler's statistics.
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


def main_loop(asm: str) -> list[str] | None:
    """The mnemonics of the main loop's instructions, in order (None: the kernel has no loop)."""
    lines = asm.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    best = None
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            span = (labels[m.group(1)], i)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    if best is None:
        return None
    return [line.split()[0] for line in lines[best[0]:best[1] + 1] if line.startswith("\t") and line.strip()]


def loop_counts(asm: str) -> dict[str, int] | None:
    """{"instructions": n, and a count a CLASSES entry} of the main loop (None: no loop)."""
    body = main_loop(asm)
    if body is None:
        return None
    return {"instructions": len(body), **{name: sum(1 for m in body if test(m)) for name, test in CLASSES.items()}}
