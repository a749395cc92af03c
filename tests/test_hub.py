"""-hf owner/name[:quant]: llama.cpp's choice of file on realistic repository listings, and
loading from a Hugging Face cache laid out on disk with HF_HUB_OFFLINE=1 (no network)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from models import tiny_model
from split_models import write_split
from vkrt.cli.main import cli
from vkrt.errors import HubError
from vkrt.model.hub import resolve
from vkrt.model.hub_files import available_tags, choose_files, split_repo_tag
from vkrt.model.split_gguf import open_gguf

Q = "Qwen3.5-35B-A3B"
UNSLOTH = [".gitattributes", "README.md", "imatrix_unsloth.gguf_file", f"{Q}-IQ4_XS.gguf", f"{Q}-Q3_K_M.gguf",
           f"{Q}-Q4_K_M.gguf", f"{Q}-Q8_0.gguf", f"{Q}-UD-IQ2_XXS.gguf", f"{Q}-UD-Q4_K_XL.gguf",
           f"{Q}-UD-Q6_K_XL.gguf", f"BF16/{Q}-BF16-00001-of-00002.gguf", f"BF16/{Q}-BF16-00002-of-00002.gguf",
           f"UD-Q8_K_XL/{Q}-UD-Q8_K_XL-00002-of-00002.gguf", f"UD-Q8_K_XL/{Q}-UD-Q8_K_XL-00001-of-00002.gguf",
           "mmproj-BF16.gguf", "mmproj-F16.gguf", "mmproj-F32.gguf"]
B = "Qwen_Qwen3-30B-A3B"
BARTOWSKI = [".gitattributes", f"{B}-IQ4_XS.gguf", f"{B}-Q4_K_L.gguf", f"{B}-Q4_K_M.gguf", f"{B}-Q4_K_S.gguf",
             f"{B}-Q6_K.gguf", f"{B}-Q6_K_L.gguf", f"{B}-Q8_0.gguf", f"{B}-bf16/{B}-bf16-00001-of-00002.gguf",
             f"{B}-bf16/{B}-bf16-00002-of-00002.gguf", f"{B}.imatrix", "README.md"]
SPLIT_ONLY = ["README.md", "Q4_K_M/Big-Q4_K_M-00003-of-00003.gguf", "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf",
              "Q4_K_M/Big-Q4_K_M-00002-of-00003.gguf", "Q8_0/Big-Q8_0-00001-of-00002.gguf",
              "Q8_0/Big-Q8_0-00002-of-00002.gguf"]


@pytest.mark.parametrize("files, tag, want", [
    (UNSLOTH, "", [f"{Q}-Q4_K_M.gguf"]),
    (UNSLOTH, "q4_k_xl", [f"{Q}-UD-Q4_K_XL.gguf"]),
    (UNSLOTH, "UD-Q4_K_XL", [f"{Q}-UD-Q4_K_XL.gguf"]),
    (UNSLOTH, "iq2_xxs", [f"{Q}-UD-IQ2_XXS.gguf"]),
    (UNSLOTH, "bf16", [f"BF16/{Q}-BF16-00001-of-00002.gguf", f"BF16/{Q}-BF16-00002-of-00002.gguf"]),
    (UNSLOTH, "UD-Q8_K_XL", [f"UD-Q8_K_XL/{Q}-UD-Q8_K_XL-00001-of-00002.gguf",
                             f"UD-Q8_K_XL/{Q}-UD-Q8_K_XL-00002-of-00002.gguf"]),
    (BARTOWSKI, "", [f"{B}-Q4_K_M.gguf"]),
    (BARTOWSKI, "Q4_K_L", [f"{B}-Q4_K_L.gguf"]),
    (BARTOWSKI, "q6_k", [f"{B}-Q6_K.gguf"]),      # not Q6_K_L: the tag must end at '.' or '-'
    (BARTOWSKI, "BF16", [f"{B}-bf16/{B}-bf16-00001-of-00002.gguf", f"{B}-bf16/{B}-bf16-00002-of-00002.gguf"]),
    (SPLIT_ONLY, "", [f"Q4_K_M/Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]),
    (SPLIT_ONLY, "q8_0", ["Q8_0/Big-Q8_0-00001-of-00002.gguf", "Q8_0/Big-Q8_0-00002-of-00002.gguf"]),
    (["m-F16.gguf", "m-Q5_K_S.gguf"], "", ["m-F16.gguf"]),    # no Q4_K_M / Q8_0: the first model file
    (["mmproj-F16.gguf", "m-Q8_0.gguf"], "", ["m-Q8_0.gguf"]),
])
def test_quant_tag_choice(files, tag, want):
    assert choose_files(files, "o/r", tag) == want


def test_mmproj_and_imatrix_are_never_the_model():
    with pytest.raises(HubError, match="no GGUF model file among the repository's files matches quant tag 'F32'"):
        choose_files(UNSLOTH, "o/r", "F32")
    with pytest.raises(HubError, match="no GGUF model files"):
        choose_files(["mmproj-F16.gguf", "README.md"], "o/r")


def test_unknown_tag_lists_the_available_ones():
    with pytest.raises(HubError) as info:
        choose_files(UNSLOTH, "unsloth/x", "Q5_K_M")
    msg = str(info.value)
    assert "quant tag 'Q5_K_M'" in msg
    assert "available: IQ4_XS, Q3_K_M, Q4_K_M, Q8_0, IQ2_XXS, Q4_K_XL, Q6_K_XL, BF16, Q8_K_XL (" in msg
    assert available_tags(BARTOWSKI) == ["IQ4_XS", "Q4_K_L", "Q4_K_M", "Q4_K_S", "Q6_K", "Q6_K_L", "Q8_0", "BF16"]


def test_hf_file_and_missing_parts():
    assert choose_files(UNSLOTH, "o/r", "Q8_0", hf_file=f"{Q}-IQ4_XS.gguf") == [f"{Q}-IQ4_XS.gguf"]
    assert len(choose_files(UNSLOTH, "o/r", hf_file=f"BF16/{Q}-BF16-00001-of-00002.gguf")) == 2
    with pytest.raises(HubError, match=r"no file 'nope.gguf' \(--hf-file\).*GGUF files: .*-IQ4_XS.gguf"):
        choose_files(UNSLOTH, "o/r", hf_file="nope.gguf")
    with pytest.raises(HubError, match="is part 1 of 3 but part\\(s\\) 2 are not among the repository's files"):
        choose_files([f for f in SPLIT_ONLY if "00002-of-00003" not in f], "o/r")


def test_repo_spec():
    assert split_repo_tag("unsloth/Qwen3.5-35B-A3B-GGUF:UD-Q4_K_XL") == ("unsloth/Qwen3.5-35B-A3B-GGUF", "UD-Q4_K_XL")
    assert split_repo_tag("owner/name") == ("owner/name", "")
    assert split_repo_tag("bartowski/Qwen_Qwen3-30B-A3B-GGUF:q4_k_m") == ("bartowski/Qwen_Qwen3-30B-A3B-GGUF", "q4_k_m")
    for bad, why in (("name", "not one '/'"), ("a/b/c", "not one '/'"), ("/b:Q4_K_M", "an empty owner or name"),
                     ("a b/c", "holds characters other than"), ("o/x..y", "holds '--' or '..'"),
                     ("o--w/n", "holds '--' or '..'"), (".o/n", "starts or ends with"), ("o/n-", "starts or ends with"),
                     ("o/" + "n" * 97, "a part of 97 characters"), ("o/n:Q4:K", "the quant tag 'Q4:K'"),
                     ("o/n:", "the quant tag ''")):
        with pytest.raises(HubError, match=f"-hf {re.escape(repr(bad))}: .*{re.escape(why)}.*expected <user>/<model>"):
            split_repo_tag(bad)


REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A Hugging Face cache holding owner/name: a single-file Q4_K_M, a Q8_0 split in a folder, an mmproj."""
    root = tmp_path_factory.mktemp("hf")
    src = tiny_model("tiny-llama", root)
    repo = root / "hub" / "models--owner--name"
    snap = repo / "snapshots" / REV
    (snap / "Q8_0").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    shutil.copyfile(src, snap / "tiny-llama-Q4_K_M.gguf")
    shutil.copyfile(src, snap / "mmproj-F16.gguf")
    shutil.copyfile(src, snap / "Q8_0" / "tiny-llama-Q8_0.gguf")
    write_split(snap / "Q8_0" / "tiny-llama-Q8_0.gguf", 2)
    os.remove(snap / "Q8_0" / "tiny-llama-Q8_0.gguf")
    return {"cache": root / "hub", "snapshot": snap, "source": src}


def test_offline_resolves_from_the_cache(hub_cache):
    snap = hub_cache["snapshot"]
    path = resolve("owner/name:q4_k_m", offline=True, cache_dir=hub_cache["cache"])
    assert path == str(snap / "tiny-llama-Q4_K_M.gguf")
    assert resolve("owner/name", offline=True, cache_dir=hub_cache["cache"]) == path
    first = resolve("owner/name:Q8_0", offline=True, cache_dir=hub_cache["cache"])
    assert first == str(snap / "Q8_0" / "tiny-llama-Q8_0-00001-of-00002.gguf")
    with open_gguf(first, progress=False) as split, open_gguf(hub_cache["source"], progress=False) as whole:
        assert len(split.parts) == 2 and list(split.tensors) == list(whole.tensors)


def test_offline_errors(hub_cache, tmp_path):
    with pytest.raises(HubError, match=r"owner/other is not in the Hugging Face cache \(.*\) and offline mode is on "
                                       r"\(HF_HUB_OFFLINE=1\)"):
        resolve("owner/other:Q4_K_M", offline=True, cache_dir=hub_cache["cache"])
    with pytest.raises(HubError, match="among the cached files matches quant tag 'Q2_K'; available: Q8_0, Q4_K_M"):
        resolve("owner/name:Q2_K", offline=True, cache_dir=hub_cache["cache"])


def test_cli_loads_from_the_cache(hub_cache, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache["cache"]), "HF_HOME": str(tmp_path)}
    args = ["run", "-p", "Hello", "-n", "3", "--temp", "0", "-c", "64", "--json"]
    proc = subprocess.run([sys.executable, "-m", "vkrt.cli", *args, "-hf", "owner/name:q4_k_m"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    direct = CliRunner().invoke(cli, [*args, "-m", hub_cache["source"]])
    assert direct.exit_code == 0, direct.output
    assert json.loads(proc.stdout)["tokens"] == json.loads(direct.output)["tokens"]

    proc = subprocess.run([sys.executable, "-m", "vkrt.cli", *args, "-hf", "owner/missing"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "owner/missing is not in the Hugging Face cache" in proc.stderr and "HF_HUB_OFFLINE=1" in proc.stderr


def test_bench_takes_hf(hub_cache, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache["cache"]))
    result = CliRunner().invoke(cli, ["bench", "-hf", "owner/name:Q8_0", "-p", "0", "-n", "2", "-r", "1", "-o", "json"])
    assert result.exit_code == 0, result.output
    row, = json.loads(result.output)
    assert row["model_filename"] == str(hub_cache["snapshot"] / "Q8_0" / "tiny-llama-Q8_0-00001-of-00002.gguf")


def test_cli_refuses_model_and_repo_together():
    result = CliRunner().invoke(cli, ["run", "-m", "a.gguf", "-hf", "o/r"])
    assert result.exit_code == 2 and "not both" in result.output
    result = CliRunner().invoke(cli, ["run", "--hf-file", "a.gguf"])
    assert result.exit_code == 2 and "-hf REPO" in result.output
