"""Modules of the repository that the installed package leaves out (scripts/, bench/), loaded
from their files for the tests, or run as their commands."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(folder: str, name: str):
    """The module ROOT/folder/name.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(folder: str, name: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """ROOT/folder/name.py run with `args` (made strings) by this Python; its output captured as text."""
    return subprocess.run([sys.executable, str(ROOT / folder / f"{name}.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, check=False)
