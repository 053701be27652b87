"""Untrusted files: pickle payloads planted in a workdir are never unpickled by eval or
resume, and nothing in the package can unpickle.

The workdir is a copy of the shared `trained` run (tests/fault_runs.py)."""

from __future__ import annotations

import glob
import os
import pickle
import re
import shutil

import fault_harness as fh
import jax
import numpy as np
import pytest

from transformer.data.tokenizers import load_tokenizer
from transformer.eval.evaluate import evaluate
from transformer.train import checkpoints, setup


class _Payload:
  """Unpickling this creates the file `marker` (standing in for arbitrary code)."""

  def __init__(self, marker: str):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_pickle_payloads_planted_in_a_workdir_never_run(tmp_path, trained):
  marker = str(tmp_path / "PWNED")
  payload = pickle.dumps(_Payload(marker))
  control = str(tmp_path / "control")
  pickle.loads(pickle.dumps(_Payload(control)))  # the payload is live: unpickling runs it
  assert os.path.exists(control)

  workdir = str(tmp_path / "run")
  shutil.copytree(trained["workdir"], workdir)
  ckpt = os.path.join(workdir, "checkpoints")
  (vocab,) = glob.glob(f"{workdir}/tokenizers/*/char_vocab.json")
  # Beside the files the loaders read: never opened. eval.py's path evaluates step 6.
  for path in (
    f"{ckpt}/6/state.pkl",
    f"{ckpt}/6/state/params.pkl",
    f"{ckpt}/6/data/state.pkl",
    vocab.replace(".json", ".pkl"),
    f"{workdir}/config.pkl",
  ):
    with open(path, "wb") as f:
      f.write(payload)
  np.save(f"{ckpt}/6/state/params.npy", np.array([_Payload(marker)], dtype=object))
  result = evaluate(workdir)
  assert result["step"] == 6 and np.isfinite(result["loss"])

  # In place of the files the loaders parse: a clean error (or a fallback), no execution.
  target = _abstract(trained["state"])
  with open(f"{ckpt}/4/state/_METADATA", "wb") as f:  # orbax: JSON
    f.write(payload)
  with open(f"{ckpt}/6/state/checkpoint", "wb") as f:  # orbax's aggregate file: msgpack
    f.write(payload)
  with checkpoints.CheckpointManager(ckpt, async_save=False) as mngr:
    with pytest.raises(ValueError, match=r"step 4 .* is corrupt: cannot read the state metadata"):
      mngr.restore(target, step=4)
    with pytest.warns(checkpoints.CorruptCheckpointWarning) as caught:
      assert mngr.restore(target).step == 2  # 6 and 4 moved aside
  assert [str(w.message).split(" in ")[0] for w in caught] == [
    "checkpoint step 6",
    "checkpoint step 4",
  ]
  with open(f"{workdir}/model_config.json", "wb") as f:  # JSON
    f.write(payload)
  with pytest.raises(ValueError, match="model_config.json: unreadable saved model config"):
    setup.load_model_config(workdir)
  with open(vocab, "wb") as f:  # JSON
    f.write(payload)
  with pytest.raises(ValueError, match="not a tokenizer JSON file"):
    load_tokenizer(vocab)
  spm = tmp_path / "spm_unigram_64.model"  # SentencePiece: a protobuf
  spm.write_bytes(payload)
  with pytest.raises(ValueError, match="not a usable SentencePiece model"):
    load_tokenizer(spm)
  assert not os.path.exists(marker)


def test_no_unsafe_deserialiser_in_the_package():
  """Nothing in transformer/ can unpickle: no pickle/dill/marshal/torch.load/yaml.load,
  no np.load without an explicit allow_pickle=False."""
  unsafe = re.compile(
    r"\b(pickle|cPickle|dill|cloudpickle|marshal|shelve)\.(loads?|Unpickler)\b"
    r"|torch\.load|yaml\.(unsafe_)?load\(|allow_pickle\s*=\s*True|\bnp\.load\((?!.*allow_pickle\s*=\s*False)"
    r"|(?<![.\w])(?<!def )(eval|exec)\("
  )
  hits = []
  for path in glob.glob(os.path.join(fh.REPO, "transformer", "**", "*.py"), recursive=True):
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
      if unsafe.search(line):
        hits.append(f"{os.path.relpath(path, fh.REPO)}:{number}: {line.strip()}")
  assert hits == []
