"""Span-corruption pretraining for translation: the token stream of a table of sentence
pairs (both languages, never side by side), `init_from` a run whose task added sentinel
ids, the `span_bible` recipe's model against the translation recipe's, and the
`span_transfer` experiment's arms, search and table."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from transformer.data import pipeline
from transformer.data.tokenizers import CharTokenizer
from transformer.research import span_transfer as st
from transformer.train import checkpoints, finetune

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(stem: str):
  path = os.path.join(REPO, "configs", f"{stem}.py")
  spec = importlib.util.spec_from_file_location(f"configs_{stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_a_pairs_stream_is_every_source_text_then_every_target_text_one_per_line():
  records = [{"en": "in the beginning", "es": "en el principio"}, {"en": "and", "es": "y"}]
  tok = CharTokenizer.train(r["en"] + r["es"] + "\n" for r in records)
  stream = pipeline.token_stream(records, tok, ("en", "es"), "\n")
  assert tok.decode(stream) == "in the beginning\nand\nen el principio\ny\n"
  assert tok.decode(pipeline.token_stream(records, tok, "en")) == "in the beginningand"  # chunks


def _source_run(root, vocab: int, width: int, kind: str = "span_corruption") -> dict:
  """A run's workdir with a checkpoint of seq2seq-shaped parameters and its config.json."""
  rng = np.random.default_rng(0)
  params = {
    "shared_embed": {"embedding": rng.normal(size=(vocab, width)).astype(np.float32)},
    "decoder": {"logits": {"kernel": rng.normal(size=(width, vocab)).astype(np.float32)}},
    "encoder": {"norm": {"scale": rng.normal(size=(width,)).astype(np.float32)}},
  }
  with checkpoints.CheckpointManager(root / "checkpoints", async_save=False) as mgr:
    assert mgr.save(10, {"params": params})
  (root / "config.json").write_text(json.dumps({"data": {"kind": kind}}))
  return params


def _target(vocab: int, width: int) -> dict:
  return {
    "shared_embed": {"embedding": np.zeros((vocab, width), np.float32)},
    "decoder": {"logits": {"kernel": np.zeros((width, vocab), np.float32)}},
    "encoder": {"norm": {"scale": np.zeros((width,), np.float32)}},
  }


def test_init_from_a_span_corruption_run_drops_exactly_its_sentinel_rows(tmp_path):
  source = _source_run(tmp_path / "span", vocab=40 + 100, width=8)  # 40 ids + 100 sentinels
  loaded = finetune.load_init_from(str(tmp_path / "span"), _target(40, 8), vocab_size=40)
  embed = source["shared_embed"]["embedding"]
  np.testing.assert_array_equal(loaded["shared_embed"]["embedding"], embed[:40])
  np.testing.assert_array_equal(
    loaded["decoder"]["logits"]["kernel"], source["decoder"]["logits"]["kernel"][:, :40]
  )
  np.testing.assert_array_equal(
    loaded["encoder"]["norm"]["scale"], source["encoder"]["norm"]["scale"]
  )
  # Another difference of vocabulary (not the task's 100 extra ids) is not cut to fit: the
  # table keeps its initial values, as any tensor of another shape.
  loaded = finetune.load_init_from(str(tmp_path / "span"), _target(30, 8), vocab_size=30)
  assert not loaded["shared_embed"]["embedding"].any()
  # A run of a task with no extra ids (same sizes otherwise): nothing is cut either.
  _source_run(tmp_path / "seq2seq", vocab=140, width=8, kind="seq2seq")
  loaded = finetune.load_init_from(str(tmp_path / "seq2seq"), _target(40, 8), vocab_size=40)
  assert not loaded["shared_embed"]["embedding"].any() and loaded["encoder"]["norm"]["scale"].any()


def test_the_pretraining_recipe_has_the_translation_model_and_data():
  span, translate = _config("span_bible"), _config("translate_en_es")
  mine, theirs = span.model.to_dict(), translate.model.to_dict()
  assert mine.pop("dropout_rate") == 0.0 and theirs.pop("dropout_rate") == 0.1
  assert mine == theirs  # every tensor of the pretrained model fits the translation model
  for field in ("path", "source_column", "target_column", "tokenizer", "vocab_size"):
    assert span.data[field] == translate.data[field], field  # the same tokenizer
  assert (span.data.kind, span.data.source, span.data.windows) == ("span_corruption", "pairs", True)
  assert span.data.eval_split == "validation"  # the translation test verses stay unseen


def _result(arm, seed, bleu, steps=1200, lr=2e-3, split="test"):
  return st.Result(2800, arm, seed, steps, lr, split, bleu, 0.4, 2.5, ((steps, 0.4),), 60.0, 90.0)


def test_the_two_arms_differ_only_in_init_from_and_the_search_has_no_bleu():
  args = dict(examples=2800, seed=1, pretrained="/runs/span")
  fine = st.run_overrides("fine-tuned", **args)
  scratch = st.run_overrides("scratch", **args)
  assert set(fine) - set(scratch) == {"--config.init_from=/runs/span"}
  for flag in ("data.train_examples=2800", "data.tokenizer_from=/runs/span", "seed=1",
               "evaluate.bleu.every=1200", "schedule.warmup_steps=120"):  # fmt: skip
    assert f"--config.{flag}" in scratch
  search = st.Settings(600, 5e-4, 600, "validation")
  searched = set(st.run_overrides("scratch", **args, settings=search))
  assert {"--config.data.eval_split=validation", "--config.evaluate.bleu.every=0"} <= searched
  with pytest.raises(ValueError, match="arm must be one of"):
    st.run_overrides("frozen", **args)


def test_the_search_picks_each_arms_best_point_and_the_table_pairs_the_seeds(tmp_path):
  for lr in (5e-4, 2e-3):
    for steps in (600, 1200):
      point = st.Settings(steps, lr, steps, "validation")
      run_dir = tmp_path / "search" / "n2800" / "scratch" / point.name / "seed0"
      run_dir.mkdir(parents=True)
      r = _result("scratch", 0, None, steps, lr, "validation")
      r = r.__class__(**{**vars(r), "accuracy": 0.3 + (lr == 2e-3) * 0.05 + (steps == 600) * 0.01})
      overrides = st.run_overrides("scratch", 2800, 0, "/pre", point)
      (run_dir / "result.json").write_text(json.dumps(dict(vars(r), overrides=overrides)))
  chosen, points = st.search(2800, "scratch", [2e-3, 5e-4], [1200, 600], 0, "/pre", tmp_path)
  assert (chosen.learning_rate, chosen.steps) == (2e-3, 600) and len(points) == 4
  results = [_result("fine-tuned", 0, 20.0), _result("scratch", 0, 14.5),
             _result("fine-tuned", 1, 21.0), _result("scratch", 1, 15.0)]  # fmt: skip
  summary = st.summarize(results)
  assert summary["gap"] == pytest.approx(5.75) and summary["paired_gaps"] == pytest.approx([5.5, 6])
  table = st.to_markdown(summary, {"scratch": (chosen, points)})
  assert "| scratch | 0.002 | 600 | **36.0** |" in table
  assert "| 2,800 | fine-tuned | 0.002 | 1200 | 20.00, 21.00 | 40.0, 40.0 | 20.50 ± 0.71 " in table
  assert "**+5.75** (per seed +5.50, +6.00)" in table
  json.dumps(summary)
