"""`config.init_from='bv:FILE.npz'`: fine-tuning a big_vision ViT checkpoint.

A tiny random checkpoint under big_vision's key names (tests/test_convert_big_vision.py)
at the sizes `tiny()` gives configs/vit_digits.py (width 32, 2 heads, 1 block, 8 x 8
greyscale digits in 4 x 4 patches, `gap` pooling) is fine-tuned for 2 steps on the shipped
digits: every tensor is copied, so the first step's training loss is the imported model's
own loss on that first batch. The run records the checkpoint's fields in its workdir and
is evaluated after the file is deleted. A head for another number of classes keeps its
initial values; a model field that conflicts with the checkpoint fails in one line.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from test_convert_big_vision import make_checkpoint, write
from test_recipes import tiny

from transformer import convert
from transformer.eval.evaluate import evaluate
from transformer.nn import tree
from transformer.tasks import losses
from transformer.train import experiment, finetune, setup
from transformer.train import loop as train_lib
from transformer.train import pretrained as pretrained_lib

DIGITS = dict(image=8, patch=4, channels=1, d=32, heads=2, layers=1, mlp=64)  # tiny()'s sizes


def _config(path, **loop):
  config = tiny("vit_digits", init_from=f"bv:{path}", **loop)
  config.model.update(
    position="learned",  # the checkpoint's table (vit_digits itself: fixed 2-D sin-cos)
    max_len=4,  # vit_digits' own 4 patches (tiny() sets 32)
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
  )
  return config


def _flat(params) -> dict[str, np.ndarray]:
  return {tree.path_str(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}


def test_two_steps_start_from_the_checkpoint_and_evaluate_without_it(tmp_path, caplog):
  path = write(tmp_path / "vit.npz", make_checkpoint("gap", classes=10, **DIGITS))
  workdir = str(tmp_path / "run")
  with caplog.at_level("INFO"):
    metrics = train_lib.train_and_evaluate(_config(path), workdir)
  assert np.isfinite(metrics["loss"])
  bv_cfg, imported = convert.big_vision.load(path)
  logged = [r.getMessage() for r in caplog.records if "tensors copied" in r.getMessage()]
  assert len(logged) == 1, logged
  copied, total = map(int, re.search(r": (\d+) of (\d+) tensors copied", logged[0]).groups())
  assert copied == total == len(jax.tree.leaves(imported)), logged  # the head too
  run_cfg = json.loads(Path(workdir, setup.MODEL_CONFIG_FILE).read_text())
  for field in ("d_model", "num_heads", "d_ff", "pooling", "position", "norm_eps", "activation"):
    assert run_cfg[field] == getattr(bv_cfg, field), field
  assert (run_cfg["num_classes"], run_cfg["image_size"], run_cfg["num_channels"]) == (10, 8, 1)

  exp = experiment.validate(_config(path))
  s = setup.build(exp, workdir)  # the same seed: the same first batch (and the data made)
  batch = next(iter(s.train_iter))
  logits, targets, weights = exp.task.apply(s.model, imported, batch)
  loss_sum, weight_sum, _ = losses.cross_entropy_with_label_smoothing(logits, targets, weights)
  lines = [json.loads(x) for x in Path(workdir, "metrics.jsonl").read_text().splitlines()]
  first = [x for x in lines if x.get("split") == "train"][0]
  assert first["step"] == 1
  np.testing.assert_allclose(first["loss"], float(loss_sum / weight_sum), rtol=1e-5)

  record = json.loads(Path(workdir, pretrained_lib.RECORD).read_text())
  assert record["init_from"] == f"bv:{path}" and record["tokenizer"] is False
  assert record["model"]["pooling"] == "mean" and record["model"]["image_size"] == 8
  Path(path).unlink()
  result = evaluate(workdir)
  assert result["step"] == 2 and np.isfinite(result["loss"]), result


def test_a_head_for_other_classes_keeps_its_initial_values(tmp_path, caplog):
  path = write(tmp_path / "vit.npz", make_checkpoint("gap", classes=7, **DIGITS))
  exp = experiment.validate(_config(path))
  assert exp.classes_from_data  # the data's 10 digits, not the checkpoint's 7
  s = setup.build(exp, str(tmp_path / "run"))
  assert s.model_cfg.num_classes == 10
  with caplog.at_level(logging.INFO):
    params = finetune.load_init_from(exp.loop.init_from, s.state.params)
  fresh, loaded = _flat(s.state.params), _flat(params)
  imported = _flat(convert.big_vision.load(path)[1]["params"])
  for key, value in loaded.items():
    expected = fresh[key] if key.startswith("head/") else imported[key]
    np.testing.assert_array_equal(value, expected, err_msg=key)
  messages = " ".join(r.getMessage() for r in caplog.records)
  assert "head/kernel is for 7 classes: kept at its initial values" in messages, messages
  assert f"{len(loaded) - 2} of {len(loaded)} tensors copied" in messages, messages


def test_a_conflicting_model_field_fails_in_one_line(tmp_path):
  path = write(tmp_path / "vit.npz", make_checkpoint("gap", classes=10, **DIGITS))
  config = tiny("vit_digits", init_from=f"bv:{path}")  # position='sinusoidal'
  config.model.max_len = 4
  with pytest.raises(ValueError) as e:
    experiment.validate(config)
  message = str(e.value)
  assert "\n" not in message
  assert re.search(r"model\.position='sinusoidal'.*checkpoint's position='learned'", message)
  config = _config(path)
  config.model.d_model = 48
  with pytest.raises(ValueError, match=r"model\.d_model=48.*d_model=32.*init_from='bv:"):
    experiment.validate(config)
  with pytest.raises(ValueError, match=r"init_from='bv:.*missing\.npz'.*no such file"):
    experiment.validate(_config(tmp_path / "missing.npz"))
