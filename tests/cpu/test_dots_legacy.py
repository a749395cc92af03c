"""The 32-value block types' CPU dot products against gguf.quants.dequantize."""

import gguf
import numpy as np
import pytest

from .dot_check import check_dot, random_rows

pytestmark = pytest.mark.op


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0"])
def test_dot_random_blocks(type_name):
    check_dot(type_name, random_rows(type_name, 24, 512))


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0"])
def test_dot_quantized_weights(type_name):
    w = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    check_dot(type_name, gguf.quants.quantize(w, gguf.GGMLQuantizationType[type_name]))
