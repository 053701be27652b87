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
from transformer.data.config import fail
from transformer.data.tokenizers import CharTokenizer
from transformer.evaluators import EVALUATORS
from transformer.evaluators.bleu import Bleu, BleuOptions
from transformer.evaluators.confusion import Confusion
from transformer.evaluators.exact_match import ExactMatch
from transformer.evaluators.harness import Harness
from transformer.evaluators.sample import Sample, SampleOptions
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.train import experiment


def _lm(**fields):
  """The tiny LM config with `fields` ({'a.b': value}) set."""
  config = tiny_lm_config.get_config()
  config.update_from_flattened_dict(fields)
  return config


def _seq2seq(**fields):
  config = _lm(**fields)
  config.model.family = "seq2seq"
  config.data.kind = "seq2seq"
  config.data.source = "pairs"
  return config


def test_the_registry_names_each_evaluator_by_its_own_name():
  assert EVALUATORS == {
    "sample": Sample, "bleu": Bleu, "confusion": Confusion, "harness": Harness,
    "exact_match": ExactMatch,
  }  # fmt: skip
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
    "sft": ("exact_match",),
    "preference": (),
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
      "known: sample, bleu, confusion, harness, exact_match",
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
      "config.evaluators=(3,): unknown evaluator 3; known: sample, bleu, confusion, harness, "
      "exact_match",
    ),
    (
      _lm(evaluators=("harness",)),
      "config.evaluate.harness.tasks=(): names no task; the 'harness' evaluator needs one or more",
    ),
    (
      _seq2seq(
        evaluators=("harness",), **{"evaluate.harness.tasks": ("shakespeare_continuation",)}
      ),
      "config.evaluators=('harness',): 'harness' cannot run on data.kind 'seq2seq': needs a task "
      "whose model continues text (a language model)",
    ),
  ],
)
def test_an_evaluator_the_run_cannot_use_is_refused_in_one_line(config, message):
  with pytest.raises(ValueError) as error:
    experiment.validate(config)
  assert str(error.value) == message


def test_training_settings_come_from_the_config_evaluate_block():
  config = _seq2seq(**{"evaluate.bleu.every": 4, "evaluate.bleu.beam_size": 3})
  exp = experiment.validate(config)
  assert exp.evaluate["bleu"] == BleuOptions(every=4, beam_size=3)
  (bleu,) = evaluators.for_training((), exp.task, exp.evaluate, 7)
  assert bleu == Bleu(every=4, method="beam", beam_size=3)
  assert [d for d in range(1, 11) if bleu.due(d, 10)] == [4, 8, 10]  # and after the last
  assert not bleu.at_end
  greedy = Bleu.for_training(tasks.get("seq2seq")(), BleuOptions(), 0)
  assert (greedy.method, greedy.beam_size, greedy.due(10, 10)) == ("greedy", 1, False)


def test_the_lm_sample_runs_at_the_end_unless_max_new_tokens_is_zero():
  lm = tasks.get("lm")()
  options = {"sample": SampleOptions(max_new_tokens=50, temperature=0.5, top_k=3)}
  (sample,) = evaluators.for_training((), lm, options, 3)
  assert sample.at_end and not sample.due(6, 6)
  assert sample.options == SampleOptions(prompts=("\n",), max_new_tokens=50, temperature=0.5,
                                         top_k=3)  # fmt: skip
  assert sample.sampling().temperature == 0.5 and sample.seed == 3
  off = {"sample": SampleOptions(max_new_tokens=0)}
  assert not evaluators.for_training((), lm, off, 3)[0].at_end


@pytest.mark.parametrize(
  ("changes", "message"),
  [
    (
      {"evaluate.sample.prompts": ("a", "b")},
      "config.evaluate.sample.prompts=('a', 'b'): training samples one prompt at the end",
    ),
    (
      {"evaluate.sample.num_samples": 2},
      "config.evaluate.sample.num_samples=2: is eval.py's, not training's",
    ),
    ({"evaluate.sample.top_p": 0.0}, "config.evaluate.sample.top_p=0.0: must be in (0, 1]"),
    (
      {"evaluate.sample.temperature": -1.0},
      "config.evaluate.sample.temperature=-1.0: must be >= 0",
    ),
    (
      {"evaluate.sample.tokens": 5},
      "config.evaluate.sample.tokens=5: unknown field; known: "
      "max_new_tokens, num_samples, past_context, prompts, temperature, top_k, top_p",
    ),
    ({"evaluate.bleu.beam_size": 0}, "config.evaluate.bleu.beam_size=0: must be >= 1"),
  ],
)
def test_a_bad_evaluator_setting_is_refused_in_one_line_naming_it(changes, message):
  with pytest.raises(ValueError) as error:
    experiment.validate(_lm(**changes))
  assert str(error.value) == message


def test_eval_options_configure_the_eval_time_evaluators():
  sample_options = SampleOptions(prompts=("ROMEO:",), num_samples=2, temperature=0.7, top_k=5)
  options = {"sample": sample_options, "bleu": BleuOptions(beam_size=1)}
  (sample,) = evaluators.for_eval((), tasks.get("lm")(), options)
  assert (sample.options, sample.at_end) == (sample_options, False)
  (bleu,) = evaluators.for_eval((), tasks.get("seq2seq")(), {"bleu": BleuOptions(beam_size=2)})
  assert (bleu.method, bleu.beam_size, bleu.every) == ("beam", 2, 0)
  (confusion,) = evaluators.for_eval((), tasks.get("image")(), {})
  assert isinstance(confusion, Confusion) and confusion.forward is not None


def test_a_prompt_for_a_run_without_the_sample_evaluator_is_refused():
  options = {"sample": SampleOptions(prompts=("x",))}
  with pytest.raises(ValueError, match="^--prompt is for language models; this run trains 'mlm'$"):
    evaluators.for_eval((), tasks.get("mlm")(), options)


def test_bad_prompts_fail_in_check_before_any_evaluation_work():
  tok = CharTokenizer.train(["And God said"])
  model = ModelConfig(family="decoder", vocab_size=tok.vocab_size, max_len=32)

  def sample(prompt, **options):
    return Sample(options=SampleOptions(prompts=(prompt,), **options))

  sample("And God", max_new_tokens=8).check(model, tok)
  with pytest.raises(ValueError, match="outside the vocabulary"):
    sample("And€", max_new_tokens=8).check(model, tok)
  with pytest.raises(ValueError, match="fills the model's context"):
    sample("And God said" * 3, max_new_tokens=8).check(model, tok)
  sample("And God said" * 3, past_context="slide").check(model, tok)  # no limit


def test_a_new_evaluator_with_an_option_is_one_class_and_one_registry_entry(monkeypatch):
  @dataclasses.dataclass(frozen=True)
  class CountOptions:
    rows: int = 1  # config.evaluate.count.rows

    def __post_init__(self):
      if self.rows < 1:
        fail("evaluate.count.rows", self.rows, "must be >= 1")

  @dataclasses.dataclass(frozen=True)
  class Count(evaluators.Evaluator):
    name = "count"
    Options = CountOptions
    rows: int = 1

    @classmethod
    def unsupported(cls, task):
      return None

    @classmethod
    def for_training(cls, task, options, seed):
      return cls(every=2, rows=options.rows)

    @classmethod
    def for_eval(cls, task, options):
      return cls(rows=options.rows)

    def run(self, run):
      return {"rows": float(self.rows)}

  monkeypatch.setitem(EVALUATORS, "count", Count)
  # The registry entry gives the config its block, config.evaluate.count.
  config = _lm(**{"evaluators": ("sample", "count"), "evaluate.count.rows": 3})
  exp = experiment.validate(config)
  chosen = evaluators.for_training(exp.eval.evaluators, exp.task, exp.evaluate, exp.loop.seed)
  assert [type(e) for e in chosen] == [Sample, Count]
  assert chosen[1].due(2, 6) and chosen[1].run(None) == {"rows": 3.0}
  config.evaluate.count.rows = 0
  with pytest.raises(ValueError, match=r"^config.evaluate.count.rows=0: must be >= 1$"):
    experiment.validate(config)


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
  (confusion,) = evaluators.for_eval((), task, {})
  result = confusion.run(run)
  logits = task.apply(model, {"params": params}, batch)[0]  # [B, C]
  predicted = np.argmax(np.asarray(logits), axis=-1)
  expected = np.zeros((3, 3), np.int64)
  for label, guess in zip(batch["label"][:5], predicted[:5], strict=True):
    expected[label, guess] += 1
  assert result["confusion_matrix"] == expected.tolist()
  assert result["confusion_table"].splitlines()[0] == "| true \\ predicted | a | b | c |"
  assert (tmp_path / "confusion_step_5.png").stat().st_size > 1000
