"""Fine-tuning: `config.init_from` copies another run's matching parameters into a new run.

`init_from='hf:DIR'` starts from a Hugging Face directory instead, `init_from='bv:FILE.npz'`
from a big_vision ViT: `experiment.validate` takes the model config from the checkpoint,
`hf_tokenizer_data` copies a directory's tokenizer into the workdir for the data,
`record_pretrained` records what the checkpoint decided in the workdir (resumes and
`eval.py` read it there, not the checkpoint), and `load_init_from` copies every tensor (a
head the checkpoint lacks, e.g. a classifier on BERT, or one for another number of classes
keeps its initial values; a learned position table is cut to a shorter `max_len`, and
DINOv2's resampled to the run's image size). See docs/FINETUNING.md.

`check_init_tokenizer` runs when the data is built (before compiling); `load_init_from`
when a run starts without a checkpoint of its own. Parameters are matched by path and
shape, so a pretrained backbone fills a classifier's backbone and the new head keeps its
initial values; token ids must mean the same in both runs (`data.tokenizer_from`). The
source run may live on object storage (`gs://...`, through `etils.epath`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath

from transformer.convert import sources
from transformer.data.config import DataConfig
from transformer.data.datasets import DataInfo
from transformer.data.files import write_atomic
from transformer.data.tokenizers import tokenizer_filename
from transformer.nn import tree
from transformer.tasks import TASKS
from transformer.train import checkpoints
from transformer.train.experiment import Experiment
from transformer.train.pretrained import RECORD, hf_dir


def _recorded(init_from: str, workdir: str) -> bool:
  """The workdir holds the record of this `init_from` (`record_pretrained`)."""
  path = epath.Path(workdir) / RECORD
  return path.exists() and json.loads(path.read_text()).get("init_from") == init_from


def hf_tokenizer_data(init_from: str, data: DataConfig, workdir: str) -> DataConfig:
  """`data` reading the tokenizer of `init_from='hf:DIR'` through the workdir cache.

  `validate` set `tokenizer='pretrained'`, `tokenizer_from=DIR` where DIR has a tokenizer;
  it is saved as `workdir/tokenizers/pretrained_vocab.json` and the data reads that file.
  A run that recorded this `init_from` reads the copy it saved, not DIR (which may be gone).
  """
  directory = hf_dir(init_from)
  if directory is None or data.tokenizer != "pretrained" or data.tokenizer_from != directory:
    return data
  from transformer.convert import tokenizers as pretrained

  saved = epath.Path(workdir) / "tokenizers" / pretrained.filename()
  if not (saved.exists() and _recorded(init_from, workdir)):
    saved = pretrained.save_to_workdir(pretrained.from_pretrained_dir(directory), workdir)
  return dataclasses.replace(data, tokenizer_from=str(saved))


def record_pretrained(exp: Experiment, workdir: str) -> None:
  """Writes `workdir/pretrained.json`: what a pretrained `init_from` decided (the model
  fields of its checkpoint, whether it brought a tokenizer), unless it is there already.

  `experiment.validate(config, workdir)` reads it instead of the checkpoint, so a resume
  or `eval.py` works once the checkpoint has moved (the weights are the run's own).
  """
  if exp.pretrained is None or _recorded(exp.loop.init_from, workdir):
    return
  text = json.dumps(exp.pretrained, indent=2, sort_keys=True)
  write_atomic(os.path.join(workdir, RECORD), text)


def _load_pretrained(init_from: str, image_size: int | None) -> tuple[int, Any]:
  """(the checkpoint's classes, 0 if none; its parameters) of an `hf:` or `bv:` init_from,
  at `image_size` (None: the checkpoint's)."""
  source, path = sources.find(init_from)
  try:
    return source.load(path, image_size)
  except ValueError as e:
    raise ValueError(f"config.init_from={init_from!r}: {e}") from None


def restore_run(path: str, field: str | None = "init_from") -> tuple[int, Any]:
  """(the ids its task added above the tokenizer's, e.g. span corruption's sentinels; the
  parameters of its latest checkpoint) of another run of this project; errors name
  `config.FIELD` (None: the caller names it)."""
  root = epath.Path(path if "://" in path else os.path.abspath(path))  # orbax: absolute paths
  inner = root / "checkpoints"
  ckpt_dir = inner if inner.is_dir() else root
  with checkpoints.CheckpointManager(ckpt_dir, max_to_keep=None, async_save=False) as mgr:
    step = mgr.latest_step()
    if step is None:
      named = f"config.{field}={path!r}: " if field else ""
      raise ValueError(f"{named}no checkpoint found in {ckpt_dir}")
    params = mgr.restore_numpy(step)["params"]
  recorded = ckpt_dir.parent / "config.json"  # the run's config (checkpoints.write_config)
  kind = json.loads(recorded.read_text()).get("data", {}).get("kind") if recorded.exists() else None
  return (TASKS[kind].extra_vocab if kind in TASKS else 0), params


def _task_rows(src: Any, leaf: Any, vocab_size: int, extra: int) -> tuple[slice, ...] | None:
  """A token table of a run whose task added `extra` ids above the tokenizer's: the
  slices that keep this model's `vocab_size` ids, where the shapes differ only on axes of
  the source's vocabulary (`vocab_size + extra`) against this one's; else None."""
  if not (extra and vocab_size) or src.ndim != leaf.ndim:
    return None
  differ = [a for a in range(src.ndim) if src.shape[a] != leaf.shape[a]]
  sizes = (vocab_size + extra, vocab_size)
  if not differ or any((src.shape[a], leaf.shape[a]) != sizes for a in differ):
    return None
  return tuple(slice(0, leaf.shape[a]) for a in range(src.ndim))


def _learned_positions(key: str, src: Any, leaf: Any) -> bool:
  """A learned position table [max_len, D] with more rows in the checkpoint."""
  table = "positions/" in key or key.endswith("pos_embedding")
  rows = src.ndim == leaf.ndim == 2 and src.shape[0] > leaf.shape[0]
  return table and rows and src.shape[1:] == leaf.shape[1:]


def _other_classes(src: Any, leaf: Any, classes: int) -> bool:
  """A head for another number of classes: the shapes differ only where the checkpoint's
  has its `classes`."""
  if not classes or src.ndim != leaf.ndim:
    return False
  differ = [a for a in range(src.ndim) if src.shape[a] != leaf.shape[a]]
  return bool(differ) and all(src.shape[a] == classes for a in differ)


def load_init_from(
  path: str, params: Any, vocab_size: int = 0, image_size: int | None = None
) -> Any:
  """Copies the parameters of another run whose paths and shapes match (fine-tuning).

  From an `hf:` directory or `bv:` file (whose config the model has) a tensor at the same
  path with another shape is an error, except a learned position table longer than
  `max_len` (its first rows are taken) and a head for another number of classes (it keeps
  its initial values). From a run whose task added ids above the tokenizer's (span
  corruption's 100 sentinels) into a model of `vocab_size` (this run's vocabulary), the
  token tables keep their first `vocab_size` ids: the tokenizer's, which mean the same in
  both runs (`check_init_tokenizer`); the sentinels are dropped. `image_size`: a ViT run's,
  at which an `hf:` DINOv2 loads with its position table resampled (None: the checkpoint's).
  """
  pretrained = sources.find(path) is not None
  classes, source = _load_pretrained(path, image_size) if pretrained else (0, None)
  extra = 0
  if not pretrained:
    extra, source = restore_run(path)
  flat_src = {tree.path_str(k): v for k, v in jax.tree_util.tree_leaves_with_path(source)}
  copied = []

  def take(keypath, leaf):
    key = tree.path_str(keypath)
    src = flat_src.get(key)
    if src is None:
      return leaf
    if pretrained and _learned_positions(key, src, leaf):
      src = src[: leaf.shape[0]]  # max_len below the checkpoint's positions
    rows = None if pretrained else _task_rows(src, leaf, vocab_size, extra)
    if rows is not None:
      logging.info("init_from %s: %s keeps the first %d ids", path, key, vocab_size)
      src = src[rows]  # the tokenizer's ids; the task's extra ids (sentinels) are dropped
    if tuple(src.shape) == tuple(leaf.shape):
      copied.append(key)
      return jnp.asarray(src, leaf.dtype)
    if pretrained and _other_classes(src, leaf, classes):
      logging.info(
        "init_from %s: %s is for %d classes: kept at its initial values", path, key, classes
      )
      return leaf
    if pretrained:
      raise ValueError(
        f"config.init_from={path!r}: tensor {key} has shape {list(src.shape)}, "
        f"the model needs {list(leaf.shape)}"
      )
    return leaf

  params = jax.tree_util.tree_map_with_path(take, params)
  if not copied:
    raise ValueError(
      f"config.init_from={path!r}: no parameter matches this model by path and shape"
    )
  logging.info(
    "init_from %s: %d of %d tensors copied", path, len(copied), len(jax.tree.leaves(params))
  )
  return params


def check_init_tokenizer(path: str, info: DataInfo) -> None:
  """`init_from` a run whose tokenizer of the same kind and size differs from this run's.

  Its embedding rows would be copied by shape onto ids that mean other tokens. A source
  run with no tokenizer of this run's kind and size is allowed (its embeddings have other
  shapes and are not copied; the rest of the model is).
  """
  if sources.find(path) is not None:
    return  # the data reads an hf: directory's own tokenizer (`hf_tokenizer_data`); bv: has none
  root = epath.Path(path) / "tokenizers"
  if info.tokenizer is None or not root.is_dir():
    return
  cfg = info.config
  name = tokenizer_filename(cfg.tokenizer, cfg.vocab_size, cfg.spm_model_type)
  # tokenizers/<data key>/<file> (no recursive glob: object storage lists by prefix)
  theirs = sorted([*root.glob(name), *root.glob(f"*/{name}")])
  if not theirs:
    return
  with tempfile.TemporaryDirectory() as tmp:
    info.tokenizer.save(Path(tmp) / name)
    mine = (Path(tmp) / name).read_bytes()
  if any(f.read_bytes() == mine for f in theirs):
    return
  raise ValueError(
    f"config.init_from={path!r}: its tokenizer {theirs[0]} differs from this run's, so token"
    f" ids would not mean the same; reuse it with --config.data.tokenizer_from={path}"
  )
