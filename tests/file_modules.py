"""Modules of the repository that the installed package leaves out (scripts/, bench/), loaded
from their files for the tests."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(folder: str, name: str):
    """The module ROOT/folder/name.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
