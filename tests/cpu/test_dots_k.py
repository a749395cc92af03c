"""The super-block types' CPU dot products against gguf.quants.dequantize."""

import pytest

from .dot_check import check_dot, random_rows

pytestmark = pytest.mark.op

F16_FIELDS = {"Q4_K": (0, 2)}


@pytest.mark.parametrize("type_name", sorted(F16_FIELDS))
def test_dot_random_blocks(type_name):
    check_dot(type_name, random_rows(type_name, 16, 512, F16_FIELDS[type_name]))
