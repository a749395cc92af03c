"""Shared fixtures: one Device per test session; validation errors fail the test that caused them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vkrt.device import Arch, Device, Instance
from vkrt.device.tuning import TABLE
from vkrt.settings import BY_NAME as VARIABLES_BY_NAME, read_variable


TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "op", "model", "server")
# top-level test modules that load a model (Model / Engine / the CLI's model commands / vkrt.load);
# the others are unit tests (device, memory, commands, compiler, files, sampler); tests/ops/ are
# op tests (kernels against numpy) and tests/server/ server tests
MODEL_MODULES = frozenset({
    "test_api", "test_cli", "test_cli_moe", "test_cli_perplexity", "test_engine_hidden", "test_engine_kv_span",
    "test_engine_mask_opt", "test_engine_mixed", "test_engine_padding", "test_engine_replay",
    "test_engine_server_steps", "test_engine_split_gemm", "test_fusions",
    "test_gpt_oss", "test_grammar", "test_granite", "test_greedy_gpu", "test_hub", "test_hybrid_engine",
    "test_hybrid_reference", "test_iq_model", "test_mixtral", "test_model_reference", "test_moe_placement",
    "test_olmoe", "test_perplexity", "test_perplexity_smollm2", "test_sampling_candidates", "test_smollm2_tensors",
    "test_layer_split", "test_split_gguf", "test_qwen3next", "test_glm4moe", "test_phi3", "test_mistral3",
    "test_cpu_experts", "test_box_rates", "test_speculative", "test_bench_speculative", "test_bench_spec_catch_up",
    "test_bench_catch_up_host",
    "test_mtp", "test_mtp_images", "test_kv_transfer",
    "test_kv_quant_model", "test_kv_quant_cli", "test_vision_encoder", "test_vision_prompt",
    "test_vision_cli", "test_kv_quant_bench", "test_bench_depth", "test_vision_gemma3", "test_vision_gemma3_prompt",
    "test_trained_context", "test_engine_mask_zero"})


def tier(path) -> str:
    """The tier marker of the test module at `path`: `pytest -m unit` (or op, model, server)."""
    folder = Path(path).resolve().relative_to(TESTS).parts[0]
    if folder in ("ops", "cpu", "server"):
        return "server" if folder == "server" else "op"
    return "model" if Path(path).stem in MODEL_MODULES else "unit"


def _profiles():
    try:
        with Instance(validate=False) as inst:
            return inst.profiles()
    except Exception:
        return []


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, tier(item.path)))
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
def spirv_cache(tmp_path):
    """A private, empty SPIR-V cache folder for tests that count compiles (compile_shader's cache_dir)."""
    return tmp_path / "cache" / "spirv"


@pytest.fixture
def device_env(device, monkeypatch):
    """device_env(VARIABLE, text): the session device's settings as if VARIABLE=text had been in
    the environment when it opened (parsed by the variable's own parser), for this test only."""
    def setenv(name: str, text: str) -> None:
        var = VARIABLES_BY_NAME[name]
        monkeypatch.setattr(device, "settings", device.settings.replace(**{var.field: var.parse(name, text)}))
    return setenv


def expect_lavapipe() -> bool:
    return bool(read_variable("VKRT_EXPECT_LAVAPIPE"))


@pytest.fixture
def lavapipe_binding_limit(device, monkeypatch):
    """Cap maxStorageBufferRange at lavapipe's 128 MiB, so tests of tensors larger than one
    binding exercise the splitting paths on devices with bigger ranges too."""
    limit = min(device.profile.max_storage_buffer_range, 128 << 20)
    monkeypatch.setattr(device, "profile", dataclasses.replace(device.profile, max_storage_buffer_range=limit))
    return limit


@pytest.fixture
def wave64(device, monkeypatch):
    """The session device laid out as the RX 580 for this test: 64-lane subgroups (emulated on
    narrower ones: vkrt/ops/reduce.py subgroup_defines, shaders/subgroup.glsl) and the AMD_GCN
    tuning table. Only the kernels that take the emulation run such layouts: the mat-vec
    entries, rms_norm, norm_rope, moe_route, the delta rule's recurrent form and flash attention's
    norm_rope prologue (and kernels without subgroup operations)."""
    prof = device.profile
    if (not prof.subgroup_shuffle or not prof.subgroup_arithmetic or prof.subgroup_min != prof.subgroup_max
            or 64 % prof.subgroup_min):
        pytest.skip("64-lane subgroups are emulated on shuffles and subgroup adds of one fixed size dividing 64")
    wide = dataclasses.replace(prof, subgroup_min=64, subgroup_max=64)
    monkeypatch.setattr(device, "profile", wide)
    monkeypatch.setattr(device, "tuning", TABLE[Arch.AMD_GCN].resolved(wide))
    return device
