"""Lookup tables the CPU dot products share: half floats, E8M0 scales."""

from __future__ import annotations

import numpy as np

# every fp16 bit pattern as float32 (a block's scale: table[lo | hi << 8])
F16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)

# MXFP4's E8M0 block scale e as float32: 2^(e - 127), read as GGML does (2^(e - 128) times the doubled values)
E8M0_HALF = np.ldexp(np.float32(1.0), np.arange(256) - 128).astype(np.float32)
