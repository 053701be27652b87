"""Evaluators: the registry, the config's choice (or the task's own), the one-line refusals
at validation, and the settings training and eval.py give them."""

from __future__ import annotations

import dataclasses
import types

import jax
import numpy as np
import pytest
import tiny_lm_config

from transformer import evaluators, tasks
from transformer.data.tokenizers import CharTokenizer
from transformer.evaluators import EVALUATORS, EvalOptions, TrainingOptions
from transformer.evaluators.bleu import Bleu
from transformer.evaluators.confusion import Confusion
from transformer.evaluators.harness import Harness
from transformer.evaluators.sample import Sample
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.train import experiment


def _lm(**top):
  config = tiny_lm_config.get_config()
  for name, value in top.items():
    config[name] = value
  return config


def _seq2seq(**top):
  config = _lm(**top)
  config.model.family = "seq2seq"
  config.data.kind = "seq2seq"
  config.data.source = "pairs"
  return config


def test_the_registry_names_each_evaluator_by_its_own_name():
  assert EVALUATORS == {"sample": Sample, "bleu": Bleu, "confusion": Confusion, "harness": Harness}
  for name, cls in EVALUATORS.items():
    assert cls.name == name


@pytest.mark.parametrize("kind", sorted(tasks.TASKS))
def test_every_task_can_run_its_default_evaluators(kind):
  task_cls = tasks.get(kind)
  assert all(name in EVALUATORS for name in task_cls.evaluators)
  evaluators.check(task_cls.evaluators, task_cls())


def test_the_defaults_are_what_each_task_did_before():
  defaults = {name: cls.evaluators for name, cls in tasks.TASKS.items()}
  assert defaults == {
    "lm": ("sample",),
    "distill": ("sample",),
    "seq2seq": ("bleu",),
    "classification": ("confusion",),
    "image": ("confusion",),
    "mlm": (),
    "span_corruption": (),
    "prefix_lm": (),
  }


def test_an_empty_choice_means_the_tasks_own_and_a_named_one_is_kept():
  exp = experiment.validate(_lm())
  assert exp.eval.evaluators == ()
  assert evaluators.names(exp.eval.evaluators, exp.task) == ("sample",)
  exp = experiment.validate(_seq2seq(evaluators=("bleu",)))
  assert evaluators.names(exp.eval.evaluators, exp.task) == ("bleu",)


@pytest.mark.parametrize(
  ("config", "message"),
  [
    (
      _lm(evaluators=("bogus",)),
      "config.evaluators=('bogus',): unknown evaluator 'bogus'; "
      "known: sample, bleu, confusion, harness",
    ),
    (
      _lm(evaluators=("bleu",)),
      "config.evaluators=('bleu',): 'bleu' cannot run on data.kind 'lm': needs source / target "
      "text pairs (a translation task)",
    ),
    (
      _seq2seq(evaluators=("sample",)),
      "config.evaluators=('sample',): 'sample' cannot run on data.kind 'seq2seq': needs a task "
      "whose model continues text (a language model)",
    ),
    (
      _lm(evaluators=("confusion",)),
      "config.evaluators=('confusion',): 'confusion' cannot run on data.kind 'lm': needs one "
      "class label per example (a classifier)",
    ),
    (
      _lm(evaluators=("sample", "sample")),
      "config.evaluators=('sample', 'sample'): names an evaluator twice",
    ),
    (
      _lm(evaluators=(3,)),
      "config.evaluators=(3,): unknown evaluator 3; known: sample, bleu, confusion, harness",
    ),
    (
      _lm(evaluators=("harness",)),
      "config.harness_tasks=(): names no task; the 'harness' evaluator needs one or more",
    ),
    (
      _seq2seq(evaluators=("harness",), harness_tasks=("shakespeare_continuation",)),
      "config.evaluators=('harness',): 'harness' cannot run on data.kind 'seq2seq': needs a task "
      "whose model continues text (a language model)",
    ),
  ],
)
def test_an_evaluator_the_run_cannot_use_is_refused_in_one_line(config, message):
  with pytest.raises(ValueError) as error:
    experiment.validate(config)
  assert str(error.value) == message


def test_training_settings_come_from_the_config_fields():
  options = experiment.validate(_seq2seq(bleu_every=4, bleu_beam_size=3)).eval.training_options(7)
  assert options == TrainingOptions(4, 3, "", 0, 0.8, seed=7)
  (bleu,) = evaluators.for_training((), tasks.get("seq2seq")(), options)
  assert bleu == Bleu(every=4, method="beam", beam_size=3)
  assert [d for d in range(1, 11) if bleu.due(d, 10)] == [4, 8, 10]  # and after the last
  assert not bleu.at_end
  greedy = Bleu.for_training(tasks.get("seq2seq")(), TrainingOptions(bleu_every=0))
  assert (greedy.method, greedy.beam_size, greedy.due(10, 10)) == ("greedy", 1, False)


def test_the_lm_sample_runs_at_the_end_unless_sample_tokens_is_zero():
  lm = tasks.get("lm")()
  options = TrainingOptions(sample_prompt="", sample_tokens=50, sample_temperature=0.5, seed=3)
  (sample,) = evaluators.for_training((), lm, options)
  assert sample.at_end and not sample.due(6, 6)
  assert (sample.prompts, sample.max_new_tokens, sample.temperature) == (("\n",), 50, 0.5)
  assert sample.sampling().temperature == 0.5 and sample.seed == 3
  (off,) = evaluators.for_training((), lm, dataclasses.replace(options, sample_tokens=0))
  assert not off.at_end


def test_eval_options_configure_the_eval_time_evaluators():
  options = EvalOptions(prompts=("ROMEO:",), num_samples=2, temperature=0.7, top_k=5,
                        bleu_method="greedy", beam_size=2)  # fmt: skip
  (sample,) = evaluators.for_eval((), tasks.get("lm")(), options)
  assert (sample.prompts, sample.num_samples, sample.top_k, sample.at_end) == (
    ("ROMEO:",), 2, 5, False
  )  # fmt: skip
  (bleu,) = evaluators.for_eval(
    (), tasks.get("seq2seq")(), dataclasses.replace(options, prompts=())
  )
  assert (bleu.method, bleu.beam_size, bleu.every) == ("greedy", 2, 0)
  (confusion,) = evaluators.for_eval((), tasks.get("image")(), EvalOptions())
  assert isinstance(confusion, Confusion) and confusion.forward is not None


def test_a_prompt_for_a_run_without_the_sample_evaluator_is_refused():
  with pytest.raises(ValueError, match="^--prompt is for language models; this run trains 'mlm'$"):
    evaluators.for_eval((), tasks.get("mlm")(), EvalOptions(prompts=("x",)))


def test_bad_prompts_fail_in_check_before_any_evaluation_work():
  tok = CharTokenizer.train(["And God said"])
  model = ModelConfig(family="decoder", vocab_size=tok.vocab_size, max_len=32)
  Sample(prompts=("And God",), max_new_tokens=8).check(model, tok)
  with pytest.raises(ValueError, match="outside the vocabulary"):
    Sample(prompts=("And€",), max_new_tokens=8).check(model, tok)
  with pytest.raises(ValueError, match="fills the model's context"):
    Sample(prompts=("And God said" * 3,), max_new_tokens=8).check(model, tok)
  Sample(prompts=("And God said" * 3,), past_context="slide").check(model, tok)  # no limit


def test_a_new_evaluator_is_one_class_and_one_registry_entry(monkeypatch):
  @dataclasses.dataclass(frozen=True)
  class Count(evaluators.Evaluator):
    name = "count"

    @classmethod
    def unsupported(cls, task):
      return None

    @classmethod
    def for_training(cls, task, options):
      return cls(every=2)

    @classmethod
    def for_eval(cls, task, options):
      return cls()

    def run(self, run):
      return {"rows": 1.0}

  monkeypatch.setitem(EVALUATORS, "count", Count)
  exp = experiment.validate(_lm(evaluators=("sample", "count")))
  chosen = evaluators.for_training(exp.eval.evaluators, exp.task, TrainingOptions())
  assert [type(e) for e in chosen] == [Sample, Count]
  assert chosen[1].due(2, 6) and chosen[1].run(None) == {"rows": 1.0}


def test_the_confusion_matrix_counts_the_models_predictions_of_the_valid_rows(tmp_path):
  task = tasks.get("classification")()
  config = ModelConfig(family="encoder", vocab_size=16, num_classes=3, d_model=16, num_heads=2,
                       num_layers=1, d_ff=32, max_len=8)  # fmt: skip
  model = build_model(config)
  rng = np.random.default_rng(0)
  batch = {
    "inputs": rng.integers(1, 16, (6, 8)).astype(np.int32),
    "segment_ids": np.ones((6, 8), np.int32),
    "positions": np.tile(np.arange(8, dtype=np.int32), (6, 1)),
    "label": np.array([0, 1, 2, 2, 1, -1], np.int32),  # the last row pads the batch
  }
  params = model.init(jax.random.PRNGKey(0), *task.init_args(batch)[0],
                      **task.init_args(batch)[1])["params"]  # fmt: skip
  info = types.SimpleNamespace(label_names=("a", "b", "c"))
  run = tasks.Run(model, params, info, lambda: iter([batch]), 0, str(tmp_path), 5)
  (confusion,) = evaluators.for_eval((), task, EvalOptions())
  result = confusion.run(run)
  logits = task.apply(model, {"params": params}, batch)[0]  # [B, C]
  predicted = np.argmax(np.asarray(logits), axis=-1)
  expected = np.zeros((3, 3), np.int64)
  for label, guess in zip(batch["label"][:5], predicted[:5], strict=True):
    expected[label, guess] += 1
  assert result["confusion_matrix"] == expected.tolist()
  assert result["confusion_table"].splitlines()[0] == "| true \\ predicted | a | b | c |"
  assert (tmp_path / "confusion_step_5.png").stat().st_size > 1000
