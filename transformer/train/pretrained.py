"""A pretrained `init_from` (`hf:DIR`, `bv:FILE.npz`, a run's workdir): what its checkpoint
decides of the config (`read_record`, `merge`), recorded in the workdir when a run is built
(`RECORD`): resumes and evaluation read it there, so the checkpoint may move or go once
the run has started. Loading its weights is `finetune.py`.
"""

from __future__ import annotations

import json
from typing import Any

from etils import epath

from transformer.convert import sources
from transformer.data.config import fail
from transformer.nn.config import RUNTIME_FIELDS

RECORD = "pretrained.json"


def hf_dir(init_from: str) -> str | None:
  """The Hugging Face directory of `init_from='hf:DIR'`, else None."""
  found = sources.find(init_from)
  return found[1] if found is not None and found[0] is sources.HF else None


def _workdir_record(init_from: str, workdir: str | None) -> dict[str, Any] | None:
  """The workdir's record of this `init_from` (None: no record, or one of another source)."""
  if not workdir:
    return None
  path = epath.Path(workdir) / RECORD
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text())
    ok = isinstance(record, dict) and isinstance(record.get("model"), dict)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: unreadable record of config.init_from ({e})") from None
  if not ok:
    raise ValueError(f"{path}: expected a JSON object with 'init_from', 'model', 'tokenizer'")
  return record if record.get("init_from") == init_from else None


def read_record(init_from: str, workdir: str | None) -> dict[str, Any]:
  """{'init_from', 'model': the checkpoint's ModelConfig fields, 'tokenizer': whether the
  checkpoint brings one, 'resamples_positions': whether it loads at another image size}:
  from the workdir's record, else read from the checkpoint."""
  record = _workdir_record(init_from, workdir)
  if record is not None:
    return record
  source, path = sources.find(init_from)
  where = f"config.init_from={init_from!r}"
  try:
    fields, tokenizer = source.describe(path)
    resamples = source.resamples(path)
  except KeyError as e:
    raise ValueError(f"{where}: config.json lacks {e}") from None
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  return {
    "init_from": init_from, "model": fields, "tokenizer": tokenizer,
    "resamples_positions": resamples,
  }  # fmt: skip


def merge(
  record: dict[str, Any],
  model: dict[str, Any],
  data: dict[str, Any],
  model_defaults: dict[str, Any],
  data_defaults: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
  """The model fields of the checkpoint (with the config's runtime fields, max_len,
  num_classes and image size) and the data fields reading its tokenizer.

  A model field the config sets (differs from `default_config()`) that the checkpoint
  decides otherwise is one `ValueError` naming the field and both values (set: differs from
  `model_defaults`, the default config's). `num_classes`
  is the config's or the data's: a head of another size keeps its initial values. A ViT's
  `image_size` is `model.image_size` where the config sets it, else `data.image_size` where
  set, else the checkpoint's; another than the checkpoint's needs a source that resamples
  its learned positions (`Source.resamples`: DINOv2), and moves `max_len` with the patch
  grid unless the config sets it.
  """
  init_from, fields = record["init_from"], record["model"]
  where = f"config.init_from={init_from!r}"
  defaults = model_defaults
  merged = dict(model)
  for name, value in fields.items():
    mine = model.get(name, defaults.get(name))
    if name in RUNTIME_FIELDS or name in ("num_classes", "image_size"):
      continue  # the config's (the checkpoint's dropout is not applied; the task's classes;
      # the image size `_resize` sets)
    if mine == defaults.get(name) or mine == value:
      merged[name] = value
    elif name != "max_len":
      fail(f"model.{name}", mine, f"conflicts with the checkpoint's {name}={value!r} ({where})")
  if merged.get("scan_layers"):
    fail("model.scan_layers", True, f"{where} loads unrolled layers: use False")
  resized = "image_size" in fields and _resize(record, merged, model, data, defaults)
  longer = merged["max_len"] > fields.get("max_len", 0)
  if merged.get("position") == "learned" and longer and not resized:  # a resampled ViT's grid
    fail(
      "model.max_len", merged["max_len"],
      f"exceeds the checkpoint's {fields.get('max_len')} learned positions ({where})",
    )  # fmt: skip
  if record.get("tokenizer"):
    from transformer.convert import tokenizers as pretrained

    if data.get("tokenizer") not in (data_defaults["tokenizer"], pretrained.KIND):
      fail("data.tokenizer", data.get("tokenizer"), f"{where} reads the checkpoint's tokenizer")
    if data.get("tokenizer_from"):
      fail("data.tokenizer_from", data["tokenizer_from"], f"{where} reads its own tokenizer")
    # `train.setup.build` copies it into the workdir and points tokenizer_from there.
    data = {**data, "tokenizer": pretrained.KIND, "tokenizer_from": sources.find(init_from)[1]}
  return merged, data


def _resize(
  record: dict[str, Any],
  merged: dict[str, Any],
  model: dict[str, Any],
  data: dict[str, Any],
  defaults: dict[str, Any],
) -> bool:
  """Sets a ViT's `merged['image_size']` (`merge`) and, where it is another than the
  checkpoint's, `max_len` (the new patch grid plus the checkpoint's prefix tokens) unless
  the config sets one; returns whether the size changed."""
  fields = record["model"]
  saved = fields["image_size"]
  size, field = saved, ""
  if model.get("image_size", defaults.get("image_size")) != defaults.get("image_size"):
    size, field = model["image_size"], "model.image_size"
  elif data.get("image_size"):  # the model takes the images it is given
    size, field = data["image_size"], "data.image_size"
  merged["image_size"] = size
  if size == saved:
    return False
  if fields.get("position") == "learned" and not record.get("resamples_positions"):
    fail(
      field, size,
      f"differs from the checkpoint's image_size={saved}, whose learned positions are not "
      f"resampled (config.init_from={record['init_from']!r}): use {saved}",
    )  # fmt: skip
  if model.get("max_len", defaults.get("max_len")) in (defaults.get("max_len"), fields["max_len"]):
    patch = fields["patch_size"]
    merged["max_len"] = fields["max_len"] - (saved // patch) ** 2 + (size // patch) ** 2
  return True
