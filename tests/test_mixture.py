"""`data.mixture` (transformer/data/mixture.py): proportions, exact resume, one tokenizer,
per-source counts and evaluation losses, and one-line refusals.

The sources are two JSONL files written here whose texts use disjoint letters, so every
batch says which source it came from.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fault_runs import tiny_lm_config

from transformer import tasks
from transformer.data import DataConfig, make_datasets
from transformer.data.mixture import batches_drawn, proportions
from transformer.train import loop as train_lib


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpora")
  rng = np.random.default_rng(0)
  for name, letters, n in (("low", "abcdefgh", 300), ("high", "stuvwxyz", 120)):
    with open(root / f"{name}.jsonl", "w") as f:
      for _ in range(n):
        words = ["".join(rng.choice(list(letters), size=rng.integers(2, 7))) for _ in range(6)]
        f.write(json.dumps({"text": " ".join(words)}) + "\n")
  return root


def _mixture(corpora, weights=(0.7, 0.3), **fields) -> DataConfig:
  values = dict(kind="lm", tokenizer="char", windows=False, packing=False,
                data_dir=str(corpora / "cache"))  # fmt: skip
  return DataConfig(
    mixture=tuple(({"name": n, "source": "hf", "path": str(corpora / f"{n}.jsonl")}, w)
                  for n, w in zip(("low", "high"), weights, strict=True)),
    **{**values, **fields},
  )  # fmt: skip


def _source_of(batch, tok) -> list[str]:
  """'low' or 'high' for each row: the letters of its text."""
  out = []
  for row in batch["inputs"]:
    text = tok.decode([int(i) for i in row if i > 6])
    out.append("low" if set(text) <= set("abcdefgh ") else "high")
  return out


def test_the_proportions_hold_over_10000_draws_and_every_window(corpora, tmp_path):
  cfg = _mixture(corpora)
  it, _, info = make_datasets(cfg, tasks.create(cfg, 16).data_spec(), tmp_path, 1, 16, 0, 0, 1)
  drawn = [_source_of(next(it), info.tokenizer)[0] for _ in range(10_000)]
  share = drawn.count("low") / len(drawn)
  assert abs(share - 0.7) < 3 * math.sqrt(0.7 * 0.3 / len(drawn)), share
  parts = proportions([0.7, 0.3])
  for n in (10, 99, 1000, 10_000):  # every prefix: the counts the log reports
    assert batches_drawn(n, parts) == [drawn[:n].count("low"), drawn[:n].count("high")]
  windows = {drawn[i : i + 10].count("low") for i in range(0, 10_000 - 10)}
  assert windows == {6, 7}  # stratified: 7 of any 10 consecutive batches, to within one


def test_a_mid_epoch_resume_continues_exactly_and_one_vocabulary_covers_both(corpora, tmp_path):
  cfg = _mixture(corpora, packing=True)
  spec = tasks.create(cfg, 16).data_spec()
  it, evaluation, info = make_datasets(cfg, spec, tmp_path, 4, 16, 3, 0, 1)
  assert set("abcdefghstuvwxyz") <= set(info.tokenizer.chars)
  for _ in range(37):  # the 120-record source is mid-epoch
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(20)]
  resumed, _, _ = make_datasets(cfg, spec, tmp_path, 4, 16, 3, 0, 1)
  resumed.set_state(state)
  for a in expected:
    b = next(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
  alone = {name: sum(1 for _ in factory()) for name, (factory, _) in info.eval_sources.items()}
  assert alone == {name: n for name, (_, n) in info.eval_sources.items()}
  assert sum(1 for _ in evaluation()) == info.eval_batches == sum(alone.values())
  assert info.stats["sources"]["low"]["weight"] == 0.7


def test_a_run_logs_each_sources_epochs_and_evaluation_loss(corpora, tmp_path):
  config = tiny_lm_config(num_train_steps=4, eval_every=4, checkpoint_every=4)
  mixture = _mixture(corpora)
  config.data.update(source="hf", windows=False, packing=False, data_dir=mixture.data_dir,
                     mixture=tuple((dict(f), w) for f, w in mixture.mixture))  # fmt: skip
  train_lib.train_and_evaluate(config, str(tmp_path))
  logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  last = [r for r in logged if r["split"] == "train"][-1]
  rows = config.batch_size
  assert (last["data/low/batches"], last["data/high/batches"]) == tuple(
    batches_drawn(4, [233, 100])
  )
  assert last["data/low/epochs"] == pytest.approx(last["data/low/batches"] * rows / 270)
  evals = [r for r in logged if r["split"] == "eval"][-1]
  assert {"loss", "low/loss", "high/loss"} <= set(evals)
  assert (
    min(evals["low/loss"], evals["high/loss"])
    <= evals["loss"]
    <= max(evals["low/loss"], evals["high/loss"])
  )


A, B = ({"path": "a"}, 1), ({"path": "b"}, 1)
WEIGHT = "the weight must be a number > 0"


@pytest.mark.parametrize(
  "mixture, message",
  [
    ([A], "DataConfig.mixture: one source is not a mixture"),
    ([A, ({"path": "b"}, -2)], f"DataConfig.mixture[1]: {WEIGHT}, got -2"),
    ([A, ({"path": "b"}, "x")], f"DataConfig.mixture[1]: {WEIGHT}, got 'x'"),
    ([A, ({"tokenizer": "byte"}, 1)], "DataConfig.mixture[1]: ['tokenizer'] cannot differ"),
    ([({"path": "x/a.txt"}, 1), ({"path": "y/a.txt"}, 1)], "DataConfig.mixture: two sources "
     "share a name: ['a', 'a']"),
    ([({"path": "a"}, 1, 2), B], "DataConfig.mixture[0]: expected (data block, weight)"),
  ],
)  # fmt: skip
def test_bad_mixtures_are_one_line(mixture, message):
  with pytest.raises(ValueError) as info:
    DataConfig(mixture=mixture)
  assert "\n" not in str(info.value) and str(info.value).startswith(message), str(info.value)
