"""-ctk / -ctv on the command line: `vkrt perplexity --kl-divergence` with a Q8_0 cache against
the F16 cache's base file runs and reports; a quantised cache with -fa off is refused by name."""

import dataclasses
import re

import pytest
from click.testing import CliRunner

from models import TINY
from vkrt.cli.common import KV_CACHE_TYPES
from vkrt.cli.main import cli
from vkrt.model.synthetic import write_model
from vkrt.ops.kv_quant import KV_TYPES

TEXT = ("The quick brown fox jumps over the lazy dog. Once upon a time there was a small model that learned "
        "to count: one, two, three, four. Hello, world! The capital of France is Paris. ") * 12


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kvq_cli")
    text = folder / "text.txt"
    text.write_text(TEXT)
    model = str(folder / "llama-hd32.gguf")
    write_model(model, dataclasses.replace(TINY["tiny-llama"], head_dim=32))
    return model, str(text), folder


def vkrt(*args):
    return CliRunner().invoke(cli, ["perplexity", *map(str, args)])


def test_choices_are_the_kv_types():
    assert KV_CACHE_TYPES == tuple(t.lower() for t in KV_TYPES)


def test_kl_divergence_with_a_q8_0_cache(files, device):
    model, text, folder = files
    base = folder / "base.kl"
    first = vkrt("-m", model, "-f", text, "-c", 64, "--chunks", 4, "--kl-divergence-base", base)
    assert first.exit_code == 0, first.output
    run = vkrt("-m", model, "-c", 64, "--kl-divergence-base", base, "--kl-divergence", "-ctk", "q8_0", "-ctv", "q8_0")
    assert run.exit_code == 0, run.output
    kld = float(re.search(r"Mean\s+KLD:\s+([-\d.]+)", run.output).group(1))
    same = float(re.search(r"Same top p:\s+([\d.]+)", run.output).group(1))
    assert 0 < kld < 0.05 and same > 90, run.output


def test_quantised_cache_needs_flash_attention(files):
    model, text, _ = files
    run = vkrt("-m", model, "-f", text, "-c", 64, "--chunks", 1, "-fa", "off", "-ctv", "q4_0")
    assert run.exit_code != 0 and "Traceback" not in run.output
    assert "-ctk/-ctv" in run.output and "-fa on" in run.output, run.output
