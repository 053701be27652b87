"""`init_from='hf:ORG/NAME'`: a Hugging Face Hub repository, read from the local Hugging
Face cache, and downloaded into it first when online.

The cache is the one `huggingface_hub` and `transformers` share, found as they find it at
the time of the call: `HF_HUB_CACHE`, else `HF_HOME`/hub, else
`$XDG_CACHE_HOME/huggingface/hub` (default `~/.cache/huggingface/hub`), laid out as
`models--ORG--NAME/snapshots/REVISION/`. With `HF_HUB_OFFLINE=1` nothing is fetched: a
repository not in the cache is one line naming it and how to fetch it. `ORG/NAME@REV`
picks a revision (a branch, tag or commit). Only what a checkpoint needs is downloaded:
its config, safetensors weights and tokenizer files. A local directory or URL with the
same spelling is read as it is.
"""

from __future__ import annotations

import os
import re

from etils import epath

# What a checkpoint directory needs: config, weights (single or sharded), tokenizer files.
PATTERNS = ("*.json", "*.safetensors", "*.model", "*.spm", "*.txt", "*.tiktoken")
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")


def cache_dir() -> str:
  """The Hugging Face hub cache folder, from the environment as it is now."""
  if os.environ.get("HF_HUB_CACHE"):
    return os.path.expanduser(os.environ["HF_HUB_CACHE"])
  xdg = os.environ.get("XDG_CACHE_HOME", "~/.cache")
  home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
  return os.path.join(os.path.expanduser(home), "hub")


def offline() -> bool:
  return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def is_repo_id(path: str) -> bool:
  """Whether `path` names a Hub repository (ORG/NAME[@REV]) rather than a directory or URL."""
  return "://" not in path and bool(REPO_ID.match(path)) and not epath.Path(path).exists()


def local_dir(path: str) -> str:
  """The checkpoint directory of `hf:path`: `path` itself, or the cached snapshot of the
  repository ORG/NAME[@REV] (downloaded first when online)."""
  if not is_repo_id(path):
    return path
  repo, _, revision = path.partition("@")
  try:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
  except ImportError as e:  # the optional extra
    raise ImportError("hf:ORG/NAME needs huggingface_hub: pip install '.[hf]'") from e
  cache = cache_dir()
  try:
    return snapshot_download(
      repo,
      revision=revision or None,
      cache_dir=cache,
      local_files_only=offline(),
      allow_patterns=list(PATTERNS),
    )
  except LocalEntryNotFoundError:
    how = f"fetch it where there is network with `hf download {repo}` into this cache"
    if not offline():
      how = "the Hub could not be reached; " + how
    raise ValueError(
      f"hf:{path}: no such directory, and not in the Hugging Face cache {cache}; {how}"
    ) from None
  except Exception as e:  # RepositoryNotFoundError, RevisionNotFoundError, HTTP errors
    raise ValueError(
      f"hf:{path}: no such directory, and cannot fetch it from the Hugging Face Hub "
      f"({' '.join(str(e).split())})"
    ) from None
