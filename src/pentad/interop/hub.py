"""Models by name: a Hugging Face Hub repository as a local directory, and as a pentad run converted once.

``pentad convert hf-to-pentad ORG/NAME OUT`` and ``init=hf:ORG/NAME`` name a model as ``from_pretrained``
does. :func:`snapshot` fetches the files a conversion reads through ``huggingface_hub.snapshot_download``,
so the Hub's cache (``HF_HUB_CACHE``, ``HF_HOME``), ``HF_HUB_OFFLINE``, ``HF_TOKEN`` and revisions (a
branch, a tag or a commit: ``--revision``, or ``@REV`` after the name) behave as they do for transformers;
a model already in the cache is read from it without the network. :func:`converted_run` converts that
snapshot into pentad's own cache (``PENTAD_CACHE``, by default ``~/.cache/pentad``), under
``hub/ORG--NAME/COMMIT``: once per commit, written beside and renamed into place, so an interrupted or
concurrent conversion never leaves a half-written run where the next command looks.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from pentad import layout
from pentad.errors import UserError
from pentad.files import temporary_dir

PREFIX = "hf:"
#: what a conversion reads: the configs, the weights, the tokenizer's files (``*.bin`` weights are fetched
#: only for a repository without safetensors)
PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]
TORCH_WEIGHTS = ["pytorch_model*.bin"]
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def is_hub_name(spec: str | Path) -> bool:
    """Whether a model argument names a Hub repository: ``hf:NAME`` always; a bare ``ORG/NAME`` only when
    no such local path exists (a local directory wins)."""
    text = str(spec)
    if text.startswith(PREFIX):
        return True
    return bool(_NAME.match(text.split("@", 1)[0])) and not Path(text).expanduser().exists()


def parse(spec: str | Path, revision: str | None = None) -> tuple[str, str | None]:
    """(repository id, revision) of ``[hf:]NAME[@REV]``; ``revision`` (``--revision``) must agree with ``@REV``."""
    text = str(spec)
    text = text[len(PREFIX):] if text.startswith(PREFIX) else text
    name, _, at = text.partition("@")
    if not name or name.count("/") > 1 or not re.match(r"^[\w.-]+(/[\w.-]+)?$", name):
        raise UserError(f"{spec}: not a Hugging Face model name (expected ORG/NAME, hf:NAME or hf:ORG/NAME, "
                        "optionally followed by @REVISION)")
    if at and revision and at != revision:
        raise UserError(f"{spec} names revision {at!r} and --revision gives {revision!r}: give one")
    return name, (at or revision or None)


def _hub_error(name: str, revision: str | None, error: Exception) -> UserError:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision}" if revision else ""
    if isinstance(error, GatedRepoError):
        return UserError(f"{name} is a gated repository on the Hugging Face Hub: accept its terms on its page, then "
                         "log in (`hf auth login`, or set HF_TOKEN) and run the command again")
    if isinstance(error, RevisionNotFoundError):
        return UserError(f"{name} has no revision {revision!r} on the Hugging Face Hub (give a branch, a tag or a "
                         "commit hash)")
    if isinstance(error, RepositoryNotFoundError):
        return UserError(f"{name}: no such model on the Hugging Face Hub, or a private one (log in with "
                         "`hf auth login`, or set HF_TOKEN); a local directory of that name does not exist either")
    if type(error).__name__ == "IncompleteSnapshotError":
        return UserError(f"{name}{at}: the snapshot in the Hugging Face cache ({constants.HF_HUB_CACHE}) is incomplete "
                         f"(an interrupted download?) and the Hub could not complete it: {error}")
    if isinstance(error, LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        return UserError(f"{name}{at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}: "
                         f"download it where the Hub is reachable (`hf download {name}`, into the same cache, "
                         "or copy the cache folder), or give a local model directory")
    return UserError(f"{name}{at}: the Hugging Face Hub refused the download ({type(error).__name__}: {error})")


def snapshot(spec: str | Path, revision: str | None = None) -> Path:
    """The local folder of ``spec``'s files (``[hf:]NAME[@REV]``) at ``revision``, from the Hub's cache or
    downloaded into it: the configs, the weights (safetensors; PyTorch ``.bin`` files when the repository
    has no safetensors) and the tokenizer's files."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    name, revision = parse(spec, revision)
    try:
        folder = Path(snapshot_download(name, revision=revision, allow_patterns=PATTERNS))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(name, revision=revision, allow_patterns=PATTERNS + TORCH_WEIGHTS))
    except (HfHubHTTPError, LocalEntryNotFoundError) as e:
        raise _hub_error(name, revision, e) from None
    except HFValidationError as e:
        raise UserError(f"{spec}: not a Hugging Face model name ({e})") from None
    if not (folder / "config.json").is_file():
        raise UserError(f"{name}: the repository has no config.json at its top level (is it a transformers model?)")
    return folder


def cache_root() -> Path:
    """pentad's own cache: ``PENTAD_CACHE``, else ``$XDG_CACHE_HOME/pentad``, else ``~/.cache/pentad``."""
    if os.environ.get("PENTAD_CACHE"):
        return Path(os.environ["PENTAD_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "pentad"


def converted_run(spec: str | Path, revision: str | None = None, *, say: Any = None) -> Path:
    """``spec``'s model (``[hf:]NAME[@REV]``) as a pentad run directory in :func:`cache_root`, converted from
    its snapshot the first time this commit is asked for (``say``: a function told what is done)."""
    from pentad.interop.convert import convert

    name, revision = parse(spec, revision)
    folder = snapshot(name, revision)
    commit = folder.name  # the Hub's cache names a snapshot by its commit hash
    target = cache_root() / "hub" / name.replace("/", "--") / commit
    if (target / layout.CONFIG).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if say is not None:
        say(f"converting {name} (commit {commit[:12]}) into {target} (once)")
    staging = temporary_dir(target.parent, f".{commit}.", ".partial")
    try:
        convert("hf-to-pentad", folder, staging / "run")
        try:
            (staging / "run").rename(target)
        except OSError:  # another command converted the same commit meanwhile
            if not (target / layout.CONFIG).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
