"""Row dot products of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) against q8_K
activations. Signature as in dots_k."""

from __future__ import annotations

DOTS: dict = {}
