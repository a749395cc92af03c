"""Shared fixtures: one Device per test session; validation errors fail the test that caused them."""

from __future__ import annotations

import dataclasses
import os

import pytest

from vkrt.device import Device, Instance


def _profiles():
    try:
        with Instance(validate=False) as inst:
            return inst.profiles()
    except Exception:
        return []


def pytest_collection_modifyitems(config, items):
    profiles = _profiles()
    real_gpu = any(p.device_type in ("discrete", "integrated") for p in profiles)
    if real_gpu:
        return
    skip = pytest.mark.skip(reason="needs a real GPU; only a CPU Vulkan device (lavapipe) is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device():
    with Device() as dev:
        yield dev


@pytest.fixture(autouse=True)
def _fail_on_validation_errors(request):
    yield
    if "device" in request.fixturenames:
        request.getfixturevalue("device").check_validation()


@pytest.fixture
def spirv_cache(tmp_path, monkeypatch):
    """A private, empty SPIR-V cache for tests that count compiles."""
    monkeypatch.setenv("VKRT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "spirv"


def expect_lavapipe() -> bool:
    return os.environ.get("VKRT_EXPECT_LAVAPIPE", "0") == "1"


@pytest.fixture
def lavapipe_binding_limit(device, monkeypatch):
    """Cap maxStorageBufferRange at lavapipe's 128 MiB, so tests of tensors larger than one
    binding exercise the splitting paths on devices with bigger ranges too."""
    limit = min(device.profile.max_storage_buffer_range, 128 << 20)
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, max_storage_buffer_range=limit))
    return limit
