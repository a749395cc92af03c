"""Fixtures: a tiny generated model and one `vkrt serve` subprocess for the server tests."""

from __future__ import annotations

import pytest
from models import tiny_model

from .serverproc import serving


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> str:
    return tiny_model("tiny-qwen3", tmp_path_factory.mktemp("server-models"))


SERVER_ARGS = ("-c", "1024", "-np", "4", "-b", "256", "-ub", "256", "--body-limit", "65536")


@pytest.fixture(scope="session")
def server(tiny_gguf):
    """One server for the session: 4 slots of 256 cells, API key API_KEY, bodies up to 64 KiB."""
    yield from serving(tiny_gguf, *SERVER_ARGS)
