"""Fine-tuning: `config.init_from` copies another run's matching parameters into a new run.

`check_init_tokenizer` runs when the data is built (before compiling); `load_init_from`
when a run starts without a checkpoint of its own. Parameters are matched by path and
shape, so a pretrained backbone fills a classifier's backbone and the new head keeps its
initial values; token ids must mean the same in both runs (`data.tokenizer_from`). The
source run may live on object storage (`gs://...`, through `etils.epath`).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath

from transformer.data.datasets import DataInfo
from transformer.data.tokenizers import tokenizer_filename
from transformer.nn import tree
from transformer.train import checkpoints


def load_init_from(path: str, params: Any) -> Any:
  """Copies the parameters of another run whose paths and shapes match (fine-tuning)."""
  inner = epath.Path(path) / "checkpoints"
  ckpt_dir = inner if inner.is_dir() else epath.Path(path)
  with checkpoints.CheckpointManager(ckpt_dir, max_to_keep=None, async_save=False) as mgr:
    step = mgr.latest_step()
    if step is None:
      raise ValueError(f"config.init_from={path!r}: no checkpoint found in {ckpt_dir}")
    source = mgr.restore_numpy(step)["params"]
  flat_src = {tree.path_str(k): v for k, v in jax.tree_util.tree_leaves_with_path(source)}
  copied = []

  def take(keypath, leaf):
    key = tree.path_str(keypath)
    src = flat_src.get(key)
    if src is not None and tuple(src.shape) == tuple(leaf.shape):
      copied.append(key)
      return jnp.asarray(src, leaf.dtype)
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
