"""`DataConfig.train_examples` (low-label training subsets) and the `low_label` experiment's
bookkeeping (step budgets, table, JSON); the experiment itself: docs/RESEARCH.md."""

import json

import numpy as np
import pytest

from transformer import tasks
from transformer.data import DataConfig, make_datasets
from transformer.data.datasets import subset_indices, training_subset
from transformer.research import low_label

WORDS = "the of and to a in that is was he for it with as his on be at by i".split()


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
  """A 120-row labelled TSV (every text distinct) and a TFDS data dir for it."""
  root = tmp_path_factory.mktemp("low_label")
  rng = np.random.default_rng(0)
  rows = [f"{k} {' '.join(rng.choice(WORDS, rng.integers(2, 9)))}" for k in range(120)]
  text = "".join(f"{t}\t{'odd' if k % 2 else 'even'}\n" for k, t in enumerate(rows))
  (root / "labelled.tsv").write_text("text\tlabel\n" + text)
  (root / "corpus.txt").write_text("".join(f"{t}.\n" for t in rows * 5))
  return root


def _config(root, **changes) -> DataConfig:
  fields = dict(
    kind="classification",
    source="labelled",
    path=str(root / "labelled.tsv"),
    data_dir=str(root / "tfds"),
    tokenizer="char",
    num_epochs=1,
  )
  return DataConfig(**{**fields, **changes})


def _datasets(root, tmp_path, seed, **changes):
  cfg = _config(root, **changes)
  return make_datasets(cfg, tasks.get(cfg.kind)().data_spec(), tmp_path, 5, 16, seed, 0, 1)


def _training_rows(root, tmp_path, seed, **changes) -> tuple[list[bytes], object]:
  """Every training row of one epoch (inputs + label, as bytes) and the `DataInfo`."""
  train, _, info = _datasets(root, tmp_path, seed, **changes)
  rows = [
    batch["inputs"][i].tobytes() + batch["label"][i].tobytes()
    for batch in train
    for i in range(len(batch["label"]))
  ]
  train.close()
  return rows, info


def test_subset_has_the_size_is_fixed_by_the_seed_and_leaves_evaluation_alone(labelled, tmp_path):
  full_rows, full = _training_rows(labelled, tmp_path / "all", 0)
  a, info = _training_rows(labelled, tmp_path / "a", 0, train_examples=30)
  b, _ = _training_rows(labelled, tmp_path / "b", 0, train_examples=30)
  other, _ = _training_rows(labelled, tmp_path / "c", 1, train_examples=30)
  assert info.train_examples == 30 and len(a) == len(set(a)) == 30  # 6 batches of 5, one epoch
  assert set(a) <= set(full_rows)  # records of the training split
  assert set(a) == set(b)  # the same seed: the same records (a fine-tuned and a scratch arm)
  assert set(other) != set(a)  # another seed: another subset
  assert info.eval_examples == full.eval_examples and info.eval_batches == full.eval_batches
  assert full.train_examples > 30


def test_subset_indices_are_sorted_distinct_and_seeded():
  idx = subset_indices(1000, 100, seed=3)
  assert len(idx) == len(set(idx.tolist())) == 100 and np.all(np.diff(idx) > 0)
  assert np.array_equal(idx, subset_indices(1000, 100, seed=3))
  assert not np.array_equal(idx, subset_indices(1000, 100, seed=4))
  # Every record once, in source order, when the subset is the whole split.
  assert list(training_subset(list("abcde"), 5, seed=0)) == list("abcde")


@pytest.mark.parametrize("value", [-1, -1000, 2.5, "10", True])
def test_bad_train_examples_is_one_line_naming_the_field(value):
  with pytest.raises(ValueError) as error:
    DataConfig.from_mapping({"train_examples": value})
  message = str(error.value)
  assert "\n" not in message and "train_examples" in message


def test_more_than_the_split_or_a_token_stream_is_refused(labelled, tmp_path):
  with pytest.raises(ValueError, match=r"train_examples=100000 exceeds the \d+ records") as error:
    _datasets(labelled, tmp_path / "big", 0, train_examples=100_000)
  assert "\n" not in str(error.value)
  stream = dict(kind="lm", source="text", path=str(labelled / "corpus.txt"))
  with pytest.raises(ValueError, match="train_examples=10: .*token stream") as error:
    _datasets(labelled, tmp_path / "lm", 0, train_examples=10, **stream)
  assert "\n" not in str(error.value)


def _result(n, arm, seed, accuracy, steps=600, lr=3e-4):
  curve = ((300, accuracy), (steps, accuracy))
  return low_label.Result(n, arm, seed, steps, lr, "test", accuracy, 0.5, curve, 60.0, 90.0)


def test_the_two_arms_differ_only_in_init_from():
  args = dict(examples=1000, seed=2, pretrained="/runs/mlm")
  fine = low_label.run_overrides("fine-tuned", **args)
  scratch = low_label.run_overrides("scratch", **args)
  assert set(fine) - set(scratch) == {"--config.init_from=/runs/mlm"}
  assert set(scratch) < set(fine)
  for flag in ("data.train_examples=1000", "data.tokenizer_from=/runs/mlm", "seed=2"):
    assert f"--config.{flag}" in scratch
  assert "--config.schedule.warmup_steps=60" in scratch  # 10% of the updates
  assert not any("eval_split" in flag for flag in scratch)  # the recipe's (test)
  search = low_label.Settings(steps=200, learning_rate=1e-3, eval_split="validation")
  searched = low_label.run_overrides("scratch", **args, settings=search)
  assert {"--config.data.eval_split=validation", "--config.num_train_steps=200"} <= set(searched)
  with pytest.raises(ValueError, match="arm must be one of"):
    low_label.run_overrides("frozen", **args)
  with pytest.raises(ValueError, match="eval_split must be"):
    low_label.Settings(eval_split="train")
  assert low_label.epochs(1000, 600) == pytest.approx(19.2)


def test_table_and_gaps_from_the_runs():
  results = [
    _result(1000, "fine-tuned", 0, 0.85),
    _result(1000, "scratch", 0, 0.78, lr=1e-3),
    _result(1000, "fine-tuned", 1, 0.87),
    _result(1000, "scratch", 1, 0.80, lr=1e-3),
  ]
  (entry,) = low_label.summarize(results)
  assert entry["arms"]["fine-tuned"]["mean"] == pytest.approx(0.86)
  assert entry["arms"]["fine-tuned"]["std"] == pytest.approx(np.std([0.85, 0.87], ddof=1))
  assert entry["gap"] == pytest.approx(0.07) and entry["paired_gaps"] == pytest.approx([0.07] * 2)
  table = low_label.to_markdown([entry])
  assert (
    "| 1,000 | fine-tuned | 0.0003 | 600 (19.2) | 85.0, 87.0 | 86.0 ± 1.4 "
    "| **+7.0** (per seed +7.0, +7.0) |" in table
  )
  assert "| 1,000 | scratch | 0.001 | 600 (19.2) | 78.0, 80.0 | 79.0 ± 1.4 |  |" in table
  json.dumps(entry)  # the JSON report holds it


def _finished(workdir, arm, point, accuracy):
  """A search run's result.json, as a previous call would have left it."""
  run_dir = workdir / "search" / "n1000" / arm / point.name / "seed0"
  run_dir.mkdir(parents=True)
  r = _result(1000, arm, 0, accuracy, point.steps, point.learning_rate)
  record = dict(vars(r), overrides=low_label.run_overrides(arm, 1000, 0, "/pre", point))
  (run_dir / "result.json").write_text(json.dumps(record))


def test_the_search_picks_each_arms_best_validation_point(tmp_path):
  for lr in (3e-4, 1e-3):
    for steps, accuracy in ((200, 0.81), (600, 0.79)):
      point = low_label.Settings(steps, lr, steps, "validation")
      _finished(tmp_path, "scratch", point, accuracy + (lr == 3e-4) * 0.01)
  chosen, points, runs = low_label.search(
    1000, "scratch", [1e-3, 3e-4], [600, 200], [0], "/pre", tmp_path
  )
  assert (chosen.steps, chosen.learning_rate) == (200, 3e-4)
  assert [(p.learning_rate, p.steps) for p, _ in points] == [
    (3e-4, 200),
    (3e-4, 600),
    (1e-3, 200),
    (1e-3, 600),
  ]
  assert all(r.split == "validation" for r in runs) and len(runs) == 4
  assert "| 1,000 | scratch | 0.0003 | 200 (6.4) | **82.0** |" in low_label.search_markdown(
    {(1000, "scratch"): (chosen, points)}
  )


def test_a_pick_on_an_edge_extends_the_grid_past_it():
  assert low_label.extended([3e-4, 1e-4, 1e-3], 1e-3) == [1e-4, 3e-4, 1e-3, 3e-3]
  assert low_label.extended([1e-4, 3e-4, 1e-3], 1e-4) == [3e-5, 1e-4, 3e-4, 1e-3]
  assert low_label.extended([200, 600, 1200], 1200, integer=True) == [200, 600, 1200, 2400]
  assert low_label.extended([200, 600, 1200], 600, integer=True) is None  # interior
  assert low_label.extended([600], 600, integer=True) is None  # nothing to extend along
  assert low_label.extended([1, 2], 1, integer=True) is None  # no step count below 1


def test_finished_runs_are_reused_only_with_the_same_settings(tmp_path):
  run_dir = tmp_path / "n1000" / "scratch" / "seed0"
  run_dir.mkdir(parents=True)
  overrides = low_label.run_overrides("scratch", 1000, 0, "/pre")
  record = dict(vars(_result(1000, "scratch", 0, 0.8)), overrides=overrides)
  (run_dir / "result.json").write_text(json.dumps(record))
  assert low_label.classify("scratch", 1000, 0, "/pre", run_dir) == _result(1000, "scratch", 0, 0.8)
  with pytest.raises(ValueError, match="other settings"):
    low_label.classify("scratch", 1000, 0, "/pre", run_dir, low_label.Settings(steps=1200))


def test_a_pretrained_run_with_a_checkpoint_is_used_as_it_is(tmp_path):
  (tmp_path / "mlm" / "checkpoints" / "1000").mkdir(parents=True)
  given = tmp_path / "mlm"
  assert low_label.pretrain(given, 0, low_label.PRETRAINING) == given  # nothing trained
  with pytest.raises(ValueError, match="--examples must be positive"):
    low_label.run([0], [0], tmp_path, tmp_path / "mlm")


def test_the_search_grows_the_grid_while_the_pick_is_on_an_edge(tmp_path):
  for lr, accuracy in ((3e-4, 0.80), (1e-3, 0.82), (3e-3, 0.83), (1e-2, 0.70)):
    _finished(tmp_path, "scratch", low_label.Settings(600, lr, 600, "validation"), accuracy)
  chosen, points, _ = low_label.search(1000, "scratch", [3e-4, 1e-3], [600], [0], "/pre", tmp_path)
  assert chosen.learning_rate == 1e-3 and len(points) == 2  # no extension asked for
  chosen, points, _ = low_label.search(
    1000, "scratch", [3e-4, 1e-3], [600], [0], "/pre", tmp_path, extend=3
  )
  assert chosen.learning_rate == 3e-3  # 1e-3 was the edge; 3e-3 beat it; 1e-2 did not
  assert [p.learning_rate for p, _ in points] == [3e-4, 1e-3, 3e-3, 1e-2]
