"""Knowledge distillation (tasks/distill.py): the loss against a NumPy reference, the
teacher frozen in the train state, and a teacher of another vocabulary refused."""

from __future__ import annotations

import json
import os
from functools import partial

import jax
import numpy as np
import pytest
import tiny_lm_config

from transformer.train import checkpoints, experiment, setup
from transformer.train import loop as train_lib
from transformer.train.step import eval_step, train_step

pytestmark = pytest.mark.one_worker  # the teacher is trained once (conftest.py)

TAU, ALPHA = 2.5, 0.3


def _np_log_softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def reference_loss(teacher, student, targets, weights, tau, alpha) -> float:
  """(1 - alpha) CE + alpha tau^2 KL(softmax(t / tau) || softmax(s / tau)), means over the
  weighted positions, in float64."""
  t, s, w = (np.asarray(x, np.float64) for x in (teacher, student, weights))
  ce = -np.take_along_axis(_np_log_softmax(s), np.asarray(targets)[..., None], -1)[..., 0]
  log_p, log_q = _np_log_softmax(t / tau), _np_log_softmax(s / tau)
  kl = (np.exp(log_p) * (log_p - log_q)).sum(-1)
  return float(((1 - alpha) * ce * w + alpha * tau**2 * kl * w).sum() / w.sum())


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
  """A tiny trained character LM, the teacher of every test here."""
  workdir = tmp_path_factory.mktemp("teacher")
  train_lib.train_and_evaluate(tiny_lm_config.get_config(), str(workdir))
  return str(workdir)


def _student_config(teacher_dir: str, **options):
  config = tiny_lm_config.get_config()
  config.model.d_model, config.model.d_ff = 16, 32  # narrower than the teacher
  config.model.dropout_rate = 0.0
  config.data.kind = "distill"
  config.task = experiment.task_block("distill")
  config.task.update({"teacher": teacher_dir, "temperature": TAU, "alpha": ALPHA, **options})
  return config


def test_the_loss_is_the_mixed_soft_kl_and_cross_entropy_of_a_numpy_reference(
  teacher_dir, tmp_path
):
  exp = experiment.validate(_student_config(teacher_dir))
  s = setup.build(exp, str(tmp_path))
  task = s.exp.task
  batch = next(s.train_iter)
  params, frozen = jax.device_get((s.state.params, s.state.frozen))  # the step donates them
  _, metrics = s.runner.train(s.runner.place_state(s.state), batch)
  student, targets, weights = jax.jit(partial(task.apply, s.model))({"params": params}, batch)
  teacher = {"params": frozen["teacher"]}
  teacher_logits, _, _ = jax.jit(partial(task.apply, task.teacher_model))(teacher, batch)
  expected = reference_loss(teacher_logits, student, targets, weights, TAU, ALPHA)
  assert float(metrics["loss"]) == pytest.approx(expected, rel=2e-5)
  # the logged soft term is the KL alone; the evaluation scores the labels' cross-entropy
  t, q = (
    _np_log_softmax(np.float64(teacher_logits) / TAU),
    _np_log_softmax(np.float64(student) / TAU),
  )
  w = np.asarray(weights, np.float64)
  kl = float(((np.exp(t) * (t - q)).sum(-1) * w).sum() / w.sum())
  assert float(metrics["distill_kl"]) == pytest.approx(kl, rel=2e-5)
  sums = jax.device_get(jax.jit(partial(eval_step, cfg=s.runner.cfg))(params, batch))
  assert sums["loss"] == pytest.approx(sums["nll"], rel=1e-6)  # no label smoothing


def test_the_teacher_is_frozen_checkpointed_and_has_no_optimizer_state(teacher_dir, tmp_path):
  workdir = str(tmp_path / "student")
  final = train_lib.train_and_evaluate(_student_config(teacher_dir), workdir)
  assert np.isfinite(final["loss"])
  with checkpoints.CheckpointManager(os.path.join(teacher_dir, "checkpoints")) as mgr:
    teacher = mgr.restore_numpy(mgr.latest_step())["params"]
  with checkpoints.CheckpointManager(os.path.join(workdir, "checkpoints")) as mgr:
    saved = mgr.restore_numpy(mgr.latest_step())
  jax.tree.map(np.testing.assert_array_equal, saved["frozen"]["teacher"], teacher)
  # the optimizer state covers the student's parameters only
  student_shapes = {x.shape for x in jax.tree.leaves(saved["params"])}
  teacher_only = {x.shape for x in jax.tree.leaves(teacher)} - student_shapes
  assert teacher_only and not teacher_only & {x.shape for x in jax.tree.leaves(saved["opt_state"])}
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert any("distill_kl" in r for r in records if r["split"] == "train")


def test_the_train_step_leaves_the_teacher_bit_identical(teacher_dir, tmp_path):
  exp = experiment.validate(_student_config(teacher_dir))
  s = setup.build(exp, str(tmp_path))
  before, params = jax.device_get((s.state.frozen, s.state.params))  # the step donates them
  state, _ = jax.jit(partial(train_step, cfg=s.runner.cfg))(s.state, next(s.train_iter))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.frozen), before)
  assert not jax.tree.all(jax.tree.map(np.array_equal, jax.device_get(state.params), params))


def test_a_teacher_with_another_vocabulary_is_refused_in_one_line(teacher_dir, tmp_path):
  config = _student_config(teacher_dir)
  config.model.vocab_size = 300  # the teacher's is the character vocabulary's
  exp = experiment.validate(config)
  with pytest.raises(ValueError) as error:
    setup.build(exp, str(tmp_path))
  message = str(error.value)
  assert "\n" not in message and message.startswith(f"config.task.teacher={teacher_dir!r}: ")
  assert "its vocabulary has" in message and "student's 300" in message


@pytest.mark.parametrize(
  ("options", "field"),
  [
    ({"teacher": ""}, "task.teacher"),
    ({"temperature": 0.0}, "task.temperature"),
    ({"alpha": 1.5}, "task.alpha"),
    ({"distill_alpha": 0.5}, "task.distill_alpha"),  # unknown: the message lists the fields
  ],
)
def test_bad_distillation_settings_fail_in_one_line(options, field):
  with pytest.raises(ValueError, match=f"^config.{field}=") as error:
    experiment.validate(_student_config("runs/teacher", **options))
  assert "\n" not in str(error.value)
  if field == "task.distill_alpha":
    assert "known: alpha, label_smoothing, teacher, temperature, z_loss" in str(error.value)


def test_the_teacher_at_its_old_place_names_its_new_one():
  config = _student_config("runs/teacher")
  config.data.teacher = "runs/teacher"
  with pytest.raises(ValueError) as error:
    experiment.validate(config)
  assert str(error.value) == (
    "config.data.teacher='runs/teacher': has moved: set config.task.teacher"
  )


def test_a_missing_teacher_is_one_line_naming_the_field(tmp_path):
  exp = experiment.validate(_student_config(str(tmp_path / "nothing")))
  with pytest.raises(ValueError) as error:
    setup.build(exp, str(tmp_path / "w"))
  assert "\n" not in str(error.value)
  assert str(error.value).startswith(f"config.task.teacher={str(tmp_path / 'nothing')!r}: ")
