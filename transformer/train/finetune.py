"""Fine-tuning: `config.init_from` copies another run's matching parameters into a new run.

`init_from='hf:DIR'` starts from a Hugging Face directory instead: `experiment.validate`
takes the model config from its config.json, `hf_tokenizer_data` copies its tokenizer into
the workdir for the data, and `load_init_from` copies every tensor (a head the checkpoint
lacks, e.g. a classifier on BERT, keeps its initial values; a learned position table is
cut to a shorter `max_len`). See docs/PRETRAINED.md.

`check_init_tokenizer` runs when the data is built (before compiling); `load_init_from`
when a run starts without a checkpoint of its own. Parameters are matched by path and
shape, so a pretrained backbone fills a classifier's backbone and the new head keeps its
initial values; token ids must mean the same in both runs (`data.tokenizer_from`). The
source run may live on object storage (`gs://...`, through `etils.epath`).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath

from transformer.data.config import DataConfig
from transformer.data.datasets import DataInfo
from transformer.data.tokenizers import tokenizer_filename
from transformer.nn import tree
from transformer.train import checkpoints
from transformer.train.experiment import hf_dir


def hf_tokenizer_data(init_from: str, data: DataConfig, workdir: str) -> DataConfig:
  """`data` reading the tokenizer of `init_from='hf:DIR'` through the workdir cache.

  `validate` set `tokenizer='pretrained'`, `tokenizer_from=DIR` where DIR has a tokenizer;
  it is saved as `workdir/tokenizers/pretrained_vocab.json` and the data reads that file
  (which also keeps it with the run for resuming and evaluation).
  """
  directory = hf_dir(init_from)
  if directory is None or data.tokenizer != "pretrained" or data.tokenizer_from != directory:
    return data
  from transformer.convert import tokenizers as pretrained

  saved = pretrained.save_to_workdir(pretrained.from_pretrained_dir(directory), workdir)
  return dataclasses.replace(data, tokenizer_from=str(saved))


def _load_hf(init_from: str, directory: str) -> Any:
  from transformer import convert

  try:
    return convert.load(directory)[1]["params"]
  except ValueError as e:
    raise ValueError(f"config.init_from={init_from!r}: {e}") from None


def _restore_run(path: str) -> Any:
  inner = epath.Path(path) / "checkpoints"
  ckpt_dir = inner if inner.is_dir() else epath.Path(path)
  with checkpoints.CheckpointManager(ckpt_dir, max_to_keep=None, async_save=False) as mgr:
    step = mgr.latest_step()
    if step is None:
      raise ValueError(f"config.init_from={path!r}: no checkpoint found in {ckpt_dir}")
    return mgr.restore_numpy(step)["params"]


def _learned_positions(key: str, src: Any, leaf: Any) -> bool:
  """A learned position table [max_len, D] with more rows in the checkpoint."""
  table = "positions/" in key or key.endswith("pos_embedding")
  rows = src.ndim == leaf.ndim == 2 and src.shape[0] > leaf.shape[0]
  return table and rows and src.shape[1:] == leaf.shape[1:]


def load_init_from(path: str, params: Any) -> Any:
  """Copies the parameters of another run whose paths and shapes match (fine-tuning).

  From an `hf:` directory (whose config the model has) a tensor at the same path with
  another shape is an error, except a learned position table longer than `max_len`
  (its first rows are taken).
  """
  directory = hf_dir(path)
  source = _restore_run(path) if directory is None else _load_hf(path, directory)
  flat_src = {tree.path_str(k): v for k, v in jax.tree_util.tree_leaves_with_path(source)}
  copied = []

  def take(keypath, leaf):
    key = tree.path_str(keypath)
    src = flat_src.get(key)
    if src is None:
      return leaf
    if directory is not None and _learned_positions(key, src, leaf):
      src = src[: leaf.shape[0]]  # max_len below the checkpoint's positions
    if tuple(src.shape) == tuple(leaf.shape):
      copied.append(key)
      return jnp.asarray(src, leaf.dtype)
    if directory is not None:
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
  if hf_dir(path) is not None:
    return  # the data reads the directory's own tokenizer (`hf_tokenizer_data`)
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
