"""`-hf owner/name[:quant]`: the repository's files listed, the GGUF file (every part of a split
one) chosen as llama.cpp chooses it, and downloaded into the Hugging Face cache by huggingface_hub
(resumed if interrupted, with progress bars, HF_TOKEN or --hf-token for private and gated
repositories). Offline (HF_HUB_OFFLINE=1), or when the hub cannot be reached, the cached snapshot
is listed instead and only cached files load. The vision projector beside the model
(mmproj*.gguf, resolve_mmproj) is found and fetched the same way."""

from __future__ import annotations

import logging
import os

from ..errors import HubError
from .hub_files import choose_files, pick_mmproj, split_repo_tag

log = logging.getLogger("vkrt")


def _cache_name(cache_dir) -> str:
    from huggingface_hub import constants
    return os.fspath(cache_dir or constants.HF_HUB_CACHE)


def offline_mode() -> bool:
    from huggingface_hub import constants
    return constants.is_offline_mode()


def cached_files(repo: str, cache_dir=None) -> list[str] | None:
    """The paths of the cached snapshot of `repo` (its main revision), or None when none is cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        root = snapshot_download(repo, cache_dir=cache_dir, local_files_only=True)
    except LocalEntryNotFoundError:
        return None
    files = []
    for folder, _, names in os.walk(root):
        rel = os.path.relpath(folder, root)
        files += [n if rel == "." else f"{rel}/{n}".replace(os.sep, "/") for n in sorted(names)]
    return sorted(files)


def list_files(repo: str, token: str | None = None, *, offline: bool | None = None,
               cache_dir=None) -> tuple[list[str], bool]:
    """The repository's file paths, from the hub or else (offline or unreachable) from the cache;
    and whether they came from the cache."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    offline = offline_mode() if offline is None else offline
    reason = "offline mode is on (HF_HUB_OFFLINE=1)"
    if not offline:
        try:
            return HfApi().list_repo_files(repo, token=token or None), False
        except GatedRepoError:
            raise HubError(f"{repo} is gated: accept its terms on huggingface.co, then pass --hf-token or set "
                           "HF_TOKEN") from None
        except RepositoryNotFoundError:
            raise HubError(f"{repo}: no such repository on Hugging Face (a private one needs --hf-token or "
                           "HF_TOKEN)") from None
        except Exception as exc:   # network, proxy or server errors: the cache may still serve
            reason = f"the hub could not be reached ({type(exc).__name__}: {exc})"
            log.warning("%s: listing the repository failed (%s); trying the cache", repo, exc)
    files = cached_files(repo, cache_dir)
    if files is None:
        raise HubError(f"{repo} is not in the Hugging Face cache ({_cache_name(cache_dir)}) and {reason}")
    return files, True


def download(repo: str, paths: list[str], token: str | None = None, *, offline: bool | None = None,
             cache_dir=None) -> list[str]:
    """Local paths of `paths` in the cache, downloaded (or resumed) where missing."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = offline_mode() if offline is None else offline
    local = []
    for path in paths:
        try:
            local.append(hf_hub_download(repo, path, token=token or None, cache_dir=cache_dir,
                                         local_files_only=offline))
        except LocalEntryNotFoundError:
            why = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the hub could not be reached"
            raise HubError(f"{repo}/{path} is not in the Hugging Face cache ({_cache_name(cache_dir)}) and "
                           f"{why}") from None
        except Exception as exc:   # the hub's HTTP errors, a full disk
            raise HubError(f"downloading {repo}/{path} failed: {type(exc).__name__}: {exc}") from None
    return local


def resolve(spec: str, hf_file: str | None = None, token: str | None = None, *, offline: bool | None = None,
            cache_dir=None) -> str:
    """`-hf owner/name[:quant]` (and `--hf-file`) -> the local path of the model file to open (the
    first part of a split model, its other parts beside it)."""
    repo, tag = split_repo_tag(spec)
    files, cached = list_files(repo, token, offline=offline, cache_dir=cache_dir)
    chosen = choose_files(files, repo, tag, hf_file, source="cached files" if cached else "repository's files")
    log.info("%s: %s", repo, ", ".join(chosen))
    return download(repo, chosen, token, offline=offline, cache_dir=cache_dir)[0]


def resolve_mmproj(spec: str, hf_file: str | None = None, token: str | None = None, *, offline: bool | None = None,
                   cache_dir=None) -> str | None:
    """The local path of the vision projector (mmproj*.gguf) beside the model `-hf spec` (and
    --hf-file) loads, downloaded where missing; None when the repository has none."""
    repo, tag = split_repo_tag(spec)
    files, cached = list_files(repo, token, offline=offline, cache_dir=cache_dir)
    model = choose_files(files, repo, tag, hf_file, source="cached files" if cached else "repository's files")[0]
    mmproj = pick_mmproj(files, model)
    if mmproj is None:
        log.info("%s: no mmproj file (no image input)", repo)
        return None
    log.info("%s: vision projector %s", repo, mmproj)
    return download(repo, [mmproj], token, offline=offline, cache_dir=cache_dir)[0]
