"""Which files of a Hugging Face repository `-hf owner/name[:quant]` loads, by llama.cpp's rules
(common/download.cpp): the first model GGUF (not mmproj, imatrix or mtp files) whose path has the
quant tag followed by '.' or '-', case-insensitively (so `:q4_k_xl` finds `UD-Q4_K_XL`); with no
tag Q4_K_M, then Q8_0, then the first model GGUF; of a split model its first part, then every part
(`Q4_K_M/NAME-00001-of-00003.gguf`, ...)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from ..errors import HubError

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_NOT_MODELS = ("mmproj", "imatrix", "mtp-")
_REPO_PART = re.compile(r"[A-Za-z0-9._-]+")
_QUANT = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class GGUFName:
    """A GGUF path read as llama.cpp reads it: the path without .gguf and the split suffix, the
    quant tag at its end (upper case), and the part number (from 1) of `count`."""

    prefix: str
    tag: str
    index: int
    count: int


def parse_name(path: str) -> GGUFName | None:
    if not path.lower().endswith(".gguf"):
        return None
    prefix, index, count = path[:-len(".gguf")], 1, 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m[1], int(m[2]), int(m[3])
    tag = _TAG.search(prefix)
    return GGUFName(prefix, tag[1].upper() if tag else "", index, count)


def _name_fault(part: str) -> str | None:
    """Why `part` is not an owner or repository name by Hugging Face's rules, or None."""
    if not part:
        return "an empty owner or name"
    if len(part) > 96:
        return f"a part of {len(part)} characters (at most 96)"
    if not _REPO_PART.fullmatch(part):
        return f"{part!r} holds characters other than letters, digits, '.', '_' and '-'"
    if part[0] in ".-" or part[-1] in ".-":
        return f"{part!r} starts or ends with '.' or '-'"
    if "--" in part or ".." in part:
        return f"{part!r} holds '--' or '..'"
    return None


def split_repo_tag(spec: str) -> tuple[str, str]:
    """'owner/name:quant' -> ('owner/name', 'quant'); the tag is '' when not given. A name that
    breaks Hugging Face's repository id rules is a HubError before anything is fetched."""
    repo, colon, tag = spec.partition(":")
    parts = repo.split("/")
    fault = "not one '/'" if len(parts) != 2 else next(filter(None, map(_name_fault, parts)), None)
    if fault is None and colon and not _QUANT.fullmatch(tag):
        fault = f"the quant tag {tag!r} is not letters, digits, '_' and '-'"
    if fault:
        raise HubError(f"-hf {spec!r}: {fault}; expected <user>/<model>[:quant], e.g. "
                       "unsloth/Qwen3-8B-GGUF:Q4_K_M")
    return repo, tag


def is_model_file(path: str) -> bool:
    name = posixpath.basename(path).lower()
    return name.endswith(".gguf") and not any(word in name for word in _NOT_MODELS)


def _first_part(path: str) -> bool:
    name = parse_name(path)
    return name.count <= 1 or name.index == 1


def pick_model(files: list[str], tag: str) -> str | None:
    """The model file for `tag` ('' = the default tags, then any model file), or None."""
    for t in [tag] if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + "[.-]", re.IGNORECASE)
        for f in files:
            if is_model_file(f) and pattern.search(f) and _first_part(f):
                return f
    if not tag:
        return next((f for f in files if is_model_file(f) and _first_part(f)), None)
    return None


def split_parts(files: list[str], primary: str, repo: str, source: str = "repository's files") -> list[str]:
    """`primary` alone, or every part of the split model it begins, in order."""
    name = parse_name(primary)
    if name is None or name.count <= 1:
        return [primary]
    parts = {}
    for f in files:
        other = parse_name(f)
        if other is not None and other.count == name.count and other.prefix == name.prefix:
            parts[other.index] = f
    missing = [i for i in range(1, name.count + 1) if i not in parts]
    if missing:
        raise HubError(f"{repo}: {primary} is part 1 of {name.count} but part(s) {', '.join(map(str, missing))} "
                       f"are not among the {source}")
    return [parts[i] for i in range(1, name.count + 1)]


def available_tags(files: list[str]) -> list[str]:
    """The quant tags of the model files (as llama.cpp reads them), in listing order."""
    tags = []
    for f in files:
        name = parse_name(f)
        if is_model_file(f) and name.tag and name.tag not in tags:
            tags.append(name.tag)
    return tags


def choose_files(files: list[str], repo: str, tag: str = "", hf_file: str | None = None,
                 source: str = "repository's files") -> list[str]:
    """The repository paths to download for `-hf repo:tag` (or `--hf-file`): one file, or every
    part of a split model, the first part first. `source` names where `files` came from."""
    if hf_file:
        if hf_file not in files:
            listed = ", ".join(f for f in files if f.lower().endswith(".gguf")) or "none"
            raise HubError(f"{repo}: no file {hf_file!r} (--hf-file) among the {source}; GGUF files: {listed}")
        return split_parts(files, hf_file, repo, source)
    primary = pick_model(files, tag)
    if primary is None:
        tags = available_tags(files)
        if not tags and not any(is_model_file(f) for f in files):
            raise HubError(f"{repo}: no GGUF model files among the {source}")
        wanted = f"quant tag {tag!r}" if tag else f"the default quant tags ({', '.join(DEFAULT_TAGS)})"
        raise HubError(f"{repo}: no GGUF model file among the {source} matches {wanted}; available: "
                       f"{', '.join(tags) or 'none'} "
                       f"(pass one as -hf {repo}:TAG, or a file name with --hf-file)")
    return split_parts(files, primary, repo, source)


MMPROJ_TYPES = ("F16", "BF16", "F32", "Q8_0")   # the projector types preferred, in order


def pick_mmproj(files: list[str], model: str) -> str | None:
    """The vision projector beside `model`: a GGUF whose name holds "mmproj" (as llama-server's -hf
    finds one), in the model's folder before others, F16 before BF16, F32, Q8_0, then any."""
    found = [f for f in files if f.lower().endswith(".gguf") and "mmproj" in posixpath.basename(f).lower()]
    folder = posixpath.dirname(model)

    def rank(f: str) -> tuple:
        name = parse_name(f)
        tag = name.tag if name is not None else ""
        return (posixpath.dirname(f) != folder, MMPROJ_TYPES.index(tag) if tag in MMPROJ_TYPES else len(MMPROJ_TYPES),
                f)
    return min(found, key=rank, default=None)
