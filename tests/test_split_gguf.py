"""Models split by gguf-split: opened from the first part as one tensor table, logits bit-identical
to the unsplit file (mmap, --no-mmap, experts in host memory), and clear errors for broken splits."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from models import tiny_model
from split_models import split_groups, write_split, write_split_by_gguf_py
from vkrt.cli.main import cli
from vkrt.engine.engine import Engine
from vkrt.errors import GGUFError
from vkrt.model.gguf_file import GGUFFile
from vkrt.model.loader import Model
from vkrt.model.split_gguf import SplitGGUF, open_gguf

PROMPT = list(range(3, 40, 2))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    return {name: tiny_model(name, d) for name in ("tiny-llama", "tiny-qwen3moe")}


def split_copy(src, folder, n_parts=3, **kw) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    dst = os.path.join(folder, os.path.basename(src))
    shutil.copyfile(src, dst)
    parts = write_split(dst, n_parts, **kw)
    os.remove(dst)
    return parts


def tensor_names(path) -> list[str]:
    with GGUFFile(path, progress=False) as f:
        return list(f.tensors)


def test_helper_writes_what_gguf_py_writes(models, tmp_path):
    src = models["tiny-llama"]
    names = tensor_names(src)
    size = len(split_groups(names, 3)[0])
    ours = split_copy(src, tmp_path / "ours")
    (tmp_path / "theirs").mkdir()
    write_split_by_gguf_py(src, tmp_path / "theirs" / "tiny-llama.gguf", size)
    for path in ours:
        theirs = tmp_path / "theirs" / os.path.basename(path)
        assert open(path, "rb").read() == theirs.read_bytes(), path


def test_one_table_over_every_part(models, tmp_path):
    src = models["tiny-llama"]
    parts = split_copy(src, tmp_path)
    assert [os.path.basename(p) for p in parts] == [f"tiny-llama-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with GGUFFile(src, progress=False) as whole, open_gguf(parts[0], progress=False) as split:
        assert isinstance(split, SplitGGUF) and [p.path for p in split.parts] == parts
        assert list(split.tensors) == list(whole.tensors)
        assert {k: v for k, v in split.metadata.items() if not k.startswith("split.")} == whole.metadata
        assert len({split.part(n).path for n in split.tensors}) == 3
        for name in whole.tensors:
            assert np.array_equal(split.data(name), whole.data(name)), name
    with open_gguf(src, progress=False) as single:
        assert isinstance(single, GGUFFile)


def logits(device, path, **kw):
    with Model(device, path, progress=False, **kw) as m, Engine(m, n_ctx=64, n_ubatch=32) as e:
        first = e.eval(PROMPT)
        files = {os.path.basename(m.gguf.part(n).path) for n in m.placement.host_tensors}
        return np.stack([first, e.eval([int(np.argmax(first))])]), m.placement, files


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "no-mmap"])
def test_dense_logits_bit_identical(device, models, tmp_path, mmap):
    parts = split_copy(models["tiny-llama"], tmp_path)
    want, *_ = logits(device, models["tiny-llama"], mmap=mmap)
    got, *_ = logits(device, parts[0], mmap=mmap)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "no-mmap"])
def test_host_experts_from_each_part(device, models, tmp_path, mmap):
    src = models["tiny-qwen3moe"]
    names = tensor_names(src)
    cut = next(i for i, n in enumerate(names) if n.startswith("blk.1."))   # layer 0 in part 1, layer 1 in part 2
    parts = split_copy(src, tmp_path, groups=[names[:cut], names[cut:]])
    want, *_ = logits(device, src, mmap=mmap, n_cpu_moe=2)
    got, placement, files = logits(device, parts[0], mmap=mmap, n_cpu_moe=2)
    assert np.array_equal(got, want)
    assert len([n for n in placement.host_tensors if "_exps." in n]) == 6
    assert files == {os.path.basename(p) for p in parts}
    if device.profile.host_import:   # each part's mapping (or anonymous copy) imported
        assert placement.host_imported == placement.host_bytes


def expect_error(first: str, match: str):
    with pytest.raises(GGUFError, match=match) as info:
        open_gguf(first, progress=False).close()
    return str(info.value)


def test_missing_part(models, tmp_path):
    parts = split_copy(models["tiny-llama"], tmp_path)
    os.remove(parts[1])
    msg = expect_error(parts[0], "part 2 of 3 of this split model is missing")
    assert msg.startswith(parts[0]) and msg.endswith(f"no file {parts[1]}")


def test_wrong_split_count(models, tmp_path):
    parts = split_copy(models["tiny-llama"], tmp_path,
                       keys=lambda no, v: v.update({"split.count": 4}) if no == 2 else None)
    msg = expect_error(parts[0], r"split.count: expected 3 \(part 3 of 3 of .*\), got 4")
    assert msg.startswith(parts[2])


def test_part_of_another_split(models, tmp_path):
    parts = split_copy(models["tiny-llama"], tmp_path)
    shutil.copyfile(parts[2], parts[1])
    msg = expect_error(parts[0], r"split.no: expected 1 .*, got 2")
    assert msg.startswith(parts[1])


def test_duplicate_tensor(models, tmp_path):
    names = tensor_names(models["tiny-llama"])
    parts = split_copy(models["tiny-llama"], tmp_path, groups=[names[:5], names[4:]])
    msg = expect_error(parts[0], "tensor 'blk.0.*' is also in .*-00001-of-00002.gguf")
    assert msg.startswith(parts[1])


def test_tensor_count_must_add_up(models, tmp_path):
    n = len(tensor_names(models["tiny-llama"]))
    parts = split_copy(models["tiny-llama"], tmp_path, 2,
                       keys=lambda no, v: v.update({"split.tensors.count": n + 1}))
    expect_error(parts[0], f"split.tensors.count: expected {n + 1} tensors, the 2 parts hold {n}")


def test_first_part_required(models, tmp_path):
    parts = split_copy(models["tiny-llama"], tmp_path)
    msg = expect_error(parts[1], "this is part 2 of 3 of a split model")
    assert msg.endswith(f"open the first part, {parts[0]}, which holds the metadata")
    renamed = str(tmp_path / "renamed.gguf")
    os.rename(parts[0], renamed)
    expect_error(renamed, "split.count is 3 but the name does not end in '-00001-of-00003.gguf'")


def test_cli_names_the_missing_part(models, tmp_path):
    parts = split_copy(models["tiny-llama"], tmp_path)
    os.remove(parts[2])
    result = CliRunner().invoke(cli, ["run", "-m", parts[0], "-n", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"no file {parts[2]}" in result.output
