"""The pretrained checkpoints `config.init_from` names, by prefix, and how each is read.

  init_from='hf:DIR'       a Hugging Face `save_pretrained` directory (`hf`, `registry`)
  init_from='hf:ORG/NAME'  a Hub repository, through the Hugging Face cache (`hub`)
  init_from='bv:FILE.npz'  a big_vision / vision_transformer ViT checkpoint (`big_vision`)

Each `Source` says how to read the model fields its checkpoint implies (and whether it
brings a tokenizer) and how to load its parameters. The training code asks `find` and
calls these; a new checkpoint format is one more `Source` in `SOURCES` (docs/PRETRAINED.md).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from etils import epath


@dataclasses.dataclass(frozen=True)
class Source:
  """One checkpoint format `init_from` can name with `prefix`."""

  prefix: str  # 'hf:' | 'bv:'
  describe: Callable[[str], tuple[dict[str, Any], bool]]  # path -> (ModelConfig fields, brings
  # its tokenizer)
  # (path, the run's image size or None: the checkpoint's) -> (its classes, 0 if none; its
  # 'params' tree)
  load: Callable[..., tuple[int, Any]]
  locate: Callable[[str], str] = lambda path: path  # the path as named -> the one to read
  # path -> whether it loads at another image size (its learned positions resampled)
  resamples: Callable[[str], bool] = lambda path: False


def _hf_describe(path: str) -> tuple[dict[str, Any], bool]:
  from transformer.convert import hf, registry
  from transformer.convert import tokenizers as pretrained

  hf_config = hf.read_config(path)
  architectures = hf_config.get("architectures") or [None]
  if len(architectures) != 1:
    raise ValueError(f"architectures={architectures}: expected one entry")
  fields = registry.get(architectures[0], "architectures").config_from_hf(hf_config)
  root = epath.Path(path)
  return fields, any((root / name).exists() for name in pretrained.SOURCE_FILES)


def _hf_load(path: str, image_size: int | None = None) -> tuple[int, Any]:
  from transformer.convert import hf

  config, params = hf.load(path, **({} if image_size is None else {"image_size": image_size}))
  return config.num_classes, params["params"]


def _hf_resamples(path: str) -> bool:
  from transformer.convert import hf, registry

  architecture = (hf.read_config(path).get("architectures") or [None])[0]
  return registry.get(architecture, "architectures").resamples_positions


def _bv_describe(path: str) -> tuple[dict[str, Any], bool]:
  from transformer.convert import big_vision

  return big_vision.config_fields(path), False


def _bv_load(path: str, image_size: int | None = None) -> tuple[int, Any]:
  from transformer.convert import big_vision

  fields, params = big_vision.load_params(path)
  if image_size not in (None, fields["image_size"]):
    raise ValueError(
      f"image_size={image_size} differs from the checkpoint's {fields['image_size']}, whose "
      f"learned positions are not resampled: use {fields['image_size']}"
    )
  return fields["num_classes"] or 0, params["params"]


def _hf_locate(path: str) -> str:
  from transformer.convert import hub

  return hub.local_dir(path)


HF = Source("hf:", _hf_describe, _hf_load, functools.cache(_hf_locate), _hf_resamples)
BIG_VISION = Source("bv:", _bv_describe, _bv_load)
SOURCES = (HF, BIG_VISION)


def find(init_from: str) -> tuple[Source, str] | None:
  """(its Source, the path to read) for a pretrained `init_from`, else None (an
  `init_from` without a prefix is another run of this project). The path is the one after
  the prefix, or where the source finds it (`hf:ORG/NAME`: the cached snapshot)."""
  for source in SOURCES:
    if init_from.startswith(source.prefix):
      return source, source.locate(init_from[len(source.prefix) :])
  return None
