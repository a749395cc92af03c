"""shaders/quant/iq_tables.glsl is what scripts/gen_iq_tables.py makes from the gguf package now,
and its packed words read back (as the shaders read them) to gguf's own tables."""

from pathlib import Path

import numpy as np
from file_modules import load
from gguf import quants

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    return load("scripts", "gen_iq_tables")


def test_committed_tables_are_generated():
    gen = load_script()
    assert gen.OUT == ROOT / "shaders" / "quant" / "iq_tables.glsl"
    assert gen.OUT.read_text() == gen.generate(), "shaders/quant/iq_tables.glsl is stale: run scripts/gen_iq_tables.py"


def gguf_grid(cls) -> np.ndarray:
    cls.init_grid()
    return cls.grid.reshape(cls.grid_shape)


def test_tables_read_back_to_gguf():
    t = load_script().tables()
    as_bytes = {name: w.astype("<u4").view(np.uint8) for name, w in t.items()}
    for name, cls in (("iq2xxs_grid", quants.IQ2_XXS), ("iq2xs_grid", quants.IQ2_XS), ("iq2s_grid", quants.IQ2_S),
                      ("iq3xxs_grid", quants.IQ3_XXS), ("iq3s_grid", quants.IQ3_S)):
        g = gguf_grid(cls)
        np.testing.assert_array_equal(as_bytes[name].reshape(g.shape), g, err_msg=name)
    # iq1s: element j of entry i in nibble 2 (j % 4) + j // 4 of word i, stored plus one
    w = t["iq1s_grid"]
    nib = [(w >> (8 * (j % 4) + 4 * (j // 4))) & 0xF for j in range(8)]
    np.testing.assert_array_equal(np.stack(nib, axis=1).astype(np.float32) - 1, gguf_grid(quants.IQ1_S))
    np.testing.assert_array_equal(as_bytes["kvalues_iq4nl"].view(np.int8), quants.IQ4_NL.kvalues)
    np.testing.assert_array_equal(as_bytes["kvalues_mxfp4"].view(np.int8), quants.MXFP4.kvalues)


def test_sign_patterns_are_their_bits_and_parity():
    """iq_common.glsl computes gguf's ksigns_iq2xs (QSIGNS) instead of reading a table: pattern i's
    seven bits, and bit 7 set where they count an odd number of negative values."""
    i = np.arange(128)
    parity = np.array([bin(v).count("1") & 1 for v in i])
    np.testing.assert_array_equal(i | (parity << 7), np.frombuffer(quants.IQ2_XXS.ksigns, np.uint8))
