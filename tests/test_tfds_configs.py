"""Every config that names a standard TFDS dataset trains two steps on that dataset, mocked.

`tfds.testing.mock_data(policy=USE_CODE)` builds each dataset's features from its TFDS
builder code (no metadata files, no network, no TensorFlow) and serves `NUM_EXAMPLES`
random examples per split; the config, shrunk by tests/test_recipes.py `tiny()`, runs
through `train_and_evaluate` exactly as on the prepared dataset: the builder lookup and the
record reading of `transformer/data/tfds_compat.py`, tokenizer training, packing, the
task's batches and evaluations. Also: the one-line error for a dataset that is not
prepared, and for a name TFDS does not know.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import tensorflow_datasets as tfds
from test_recipes import TFDS_CONFIGS, tiny

from transformer.data import DataConfig, builders, features, sources
from transformer.eval.evaluate import evaluate
from transformer.evaluators.bleu import BleuOptions
from transformer.train import loop as train_lib

NUM_EXAMPLES = 24  # per split: three batches of 8


@pytest.fixture
def mocked():
  with tfds.testing.mock_data(num_examples=NUM_EXAMPLES, policy=tfds.testing.MockPolicy.USE_CODE):
    yield


def _metrics(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("stem", sorted(set(TFDS_CONFIGS) - {"transformer_wmt"}))
def test_tfds_config_trains_two_steps_on_mock_data(stem, tmp_path, mocked):
  config = tiny(stem)
  metrics = train_lib.train_and_evaluate(config, str(tmp_path))
  assert math.isfinite(metrics["loss"]), metrics
  assert os.path.isdir(tmp_path / "checkpoints" / "2")


def test_transformer_wmt_trains_and_scores_bleu_on_the_test_split(tmp_path, mocked, capsys):
  config = tiny("transformer_wmt", eval_every=2, **{"evaluate.bleu.every": 2})
  assert config.data.path == "wmt14_translate/de-en" and config.data.eval_split == "test"
  metrics = train_lib.train_and_evaluate(config, str(tmp_path))
  assert math.isfinite(metrics["loss"]), metrics
  evals = [m for m in _metrics(tmp_path) if "bleu" in m]
  assert evals and all(0.0 <= m["bleu"] <= 100.0 for m in evals), evals
  logged = [line for line in capsys.readouterr().out.splitlines() if "sacrebleu" in line]
  assert logged and " on test " in logged[-1] and "nrefs:1|case:mixed" in logged[-1], logged
  greedy = {"bleu": BleuOptions(beam_size=1)}
  result = evaluate(str(tmp_path), options=greedy)  # eval.py's path
  assert result["split"] == "test" and result["bleu_signature"].startswith("nrefs:1|case:mixed")
  assert len(result["examples"]) == 5 and 0.0 <= result["bleu"] <= 100.0


def test_mock_sources_read_in_bulk(mocked):
  """Bulk reads of a mocked source (the tokenizer, the overlong scan) go record by record."""
  cfg = DataConfig(kind="lm", source="tfds", path="lm1b", eval_split="test")
  splits = sources.open_splits(cfg)
  records = list(features.read_records(splits.train, range(5)))
  assert [i for i, _ in records] == list(range(5))
  assert all(isinstance(features.text_of(r, "text"), str) for _, r in records)


@pytest.mark.parametrize("name", ["wmt14_translate/de-en", "glue/sst2"])
def test_builders_of_every_tfds_package_are_found(name, mocked):
  paired = name.startswith("wmt")
  cfg = DataConfig(
    kind="seq2seq" if paired else "classification",
    source="tfds",
    path=name,
    source_column="en",
    target_column="de",
    text_column="sentence",
  )
  splits = sources.open_splits(cfg, paired=paired)
  assert len(splits.train) == NUM_EXAMPLES
  assert splits.text_keys == (("en", "de") if paired else ("sentence",))
  assert splits.label_names == (() if paired else ("negative", "positive"))


def test_an_unprepared_dataset_names_the_build_command_in_one_line(tmp_path):
  cfg = DataConfig(kind="lm", source="tfds", path="lm1b", data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError) as e:
    sources.open_splits(cfg)
  message = str(e.value)
  assert "\n" not in message
  assert f"tfds build lm1b --file_format=array_record --data_dir={tmp_path}" in message
  wmt = DataConfig(
    kind="seq2seq", source="tfds", path="wmt14_translate/de-en", data_dir=str(tmp_path)
  )
  with pytest.raises(FileNotFoundError, match="tfds build wmt14_translate/de-en --file_format"):
    sources.open_splits(wmt, paired=True)


def test_a_prepared_dataset_by_name_reads_in_bulk_and_names_its_splits(tmp_path):
  """Not mocked: a dataset prepared as array_record (here a local builder) opened by name."""
  (tmp_path / "p.tsv").write_text("en\tde\n" + "".join(f"hi {k}\thallo {k}\n" for k in range(60)))
  b = builders.sentence_pairs(
    tmp_path / "p.tsv",
    ["en", "de"],
    str(tmp_path / "tfds"),
    validation_fraction=0.2,
    test_fraction=0.0,
  )
  cfg = DataConfig(
    kind="seq2seq", source="tfds", path=f"{b.name}/{b.builder_config.name}",
    data_dir=str(tmp_path / "tfds"), source_column="en", target_column="de",
  )  # fmt: skip
  splits = sources.open_splits(cfg, paired=True)
  assert hasattr(splits.eval, "__getitems__")  # the real source, bulk reads intact
  records = list(features.read_records(splits.eval, range(len(splits.eval))))
  assert [features.text_of(r, "de") for _, r in records] == [
    features.text_of(splits.eval[i], "de") for i in range(len(splits.eval))
  ]
  with pytest.raises(
    ValueError, match=r"no split 'dev'; prepared splits: \['train', 'validation'\]"
  ):
    sources.open_splits(cfg.replace(eval_split="dev"), paired=True)


def test_an_unknown_tfds_name_is_one_line():
  cfg = DataConfig(kind="lm", source="tfds", path="lm1bb")
  with pytest.raises(ValueError) as e:
    sources.open_splits(cfg)
  assert "\n" not in str(e.value) and "DataConfig.path='lm1bb'" in str(e.value)
