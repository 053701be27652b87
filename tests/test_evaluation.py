"""eval.py and the evaluation helpers: BLEU plumbing, confusion matrices, bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu
from session_env import PATIENCE_S

from transformer import decode as decoding
from transformer import tasks
from transformer.data import DataConfig, features, make_datasets, sources
from transformer.data.tokenizers import CharTokenizer
from transformer.evaluators import bleu, confusion, sample
from transformer.evaluators.base import strip_ids
from transformer.tasks import seq2seq
from transformer.train import loop as train_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = [
  "In the beginning God created the heaven and the earth.",
  "And the earth was without form, and void.",
  "And God said, Let there be light: and there was light.",
]


def test_bleu_through_the_project_equals_sacrebleu_on_the_same_strings(monkeypatch):
  tok = CharTokenizer.train(TEXTS + ["xyzq"])
  refs = TEXTS
  hyps = ["In the beginning God made the heaven and earth.", "And the earth was void.", "xyz"]

  def row(text, length=64):
    ids = tok.encode(text) + [tok.eos_id]
    return ids + [0] * (length - len(ids))

  batch = {
    "inputs": np.ones((4, 8), np.int32),
    "inputs_segment_ids": np.array([[1] * 8] * 3 + [[0] * 8], np.int32),  # last row: padding
    "targets": np.array([row(t) for t in refs] + [row("")], np.int32),
  }

  class Fake:
    tokens = np.array([row(h) for h in hyps], np.int32)

  monkeypatch.setattr(decoding, "translate", lambda *a, **k: Fake)
  result = bleu.corpus_bleu(None, None, tok, [batch], method="greedy", references=refs)
  expected = sacrebleu.corpus_bleu(hyps, [refs])
  assert result["bleu"] == pytest.approx(expected.score, abs=1e-9)
  assert result["bleu_signature"].startswith("nrefs:1")
  assert [e["reference"] for e in result["examples"]] == refs


def test_bleu_scores_against_the_raw_reference_text_of_the_split(monkeypatch, tmp_path):
  """References the tokenizer cannot round-trip (unknown characters, truncated rows) are
  scored as the split stores them, in the order of the evaluation batches."""
  words = ["Preis", "fünf", "Euro", "5 €", "Straße", "groß", "und", "der", "die", "das"]
  rng = np.random.default_rng(0)
  lines = [" ".join(rng.choice(words, 6)) + f" {k}" for k in range(60)]
  tsv = tmp_path / "copy.tsv"
  tsv.write_text("en\tde\n" + "".join(f"{t}\t{t}\n" for t in lines), encoding="utf-8")
  ascii_tok = CharTokenizer.train(
    ["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789"]
  )
  ascii_tok.save(tmp_path / "ascii.json")  # no 'ü', 'ß' or '€': they encode to UNK
  cfg = DataConfig(
    kind="seq2seq", source="pairs", path=str(tsv), data_dir=str(tmp_path / "tfds"),
    source_column="en", target_column="de", tokenizer="char",
    tokenizer_from=str(tmp_path / "ascii.json"), validation_fraction=0.4, test_fraction=0.0,
    target_seq_len=24,
  )  # fmt: skip
  spec = tasks.get("seq2seq")().data_spec()
  _, eval_factory, info = make_datasets(cfg, spec, tmp_path / "run", 8, 24, 0, 0, 1)
  split = sources.open_splits(cfg, paired=True).eval
  raw = [features.text_of(split[i], "de") for i in range(len(split))]
  assert any("€" in r for r in raw) and any(len(r) > 23 for r in raw)  # lossy and truncated

  class Copy:  # a perfect copy model: the hypothesis is the (lossy, truncated) source
    def __init__(self, inputs):
      self.tokens = inputs

  monkeypatch.setattr(decoding, "translate", lambda model, params, inputs, **k: Copy(inputs))
  tok = info.tokenizer
  result = bleu.corpus_bleu(
    None, None, tok, eval_factory(), method="greedy",
    references=seq2seq.eval_references(cfg, str(tmp_path / "run")),
  )  # fmt: skip
  hyps = [tok.decode(strip_ids(b)) for batch in eval_factory() for b in batch["inputs"]]
  hyps = hyps[: len(raw)]  # the rest are padding rows
  assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [raw]).score, abs=1e-9)
  detok = [tok.decode(strip_ids(t)) for b in eval_factory() for t in b["targets"]]
  assert sacrebleu.corpus_bleu(hyps, [detok[: len(raw)]]).score == pytest.approx(100.0)
  assert result["bleu"] < 100.0  # against the detokenized targets the copy would be perfect
  assert [e["reference"] for e in result["examples"]] == raw[:5]
  assert result["bleu_signature"].startswith("nrefs:1|case:mixed")
  with pytest.raises(ValueError, match="out of step"):
    bleu.corpus_bleu(
      None, None, tok, eval_factory(), method="greedy", references=list(reversed(raw))
    )
  with pytest.raises(ValueError, match="too few references"):
    bleu.corpus_bleu(None, None, tok, eval_factory(), method="greedy", references=raw[:-1])


def test_confusion_table_and_png(tmp_path):
  counts = np.array([[5, 1], [2, 7]])
  png = tmp_path / "c.png"
  table = confusion.write_confusion(counts, ["OT", "NT"], str(png))
  assert table.splitlines()[2] == "| OT | 5 | 1 |"
  assert png.stat().st_size > 1000


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory):
  sys.path.insert(0, os.path.join(REPO, "tests"))
  import tiny_lm_config

  workdir = str(tmp_path_factory.mktemp("lm"))
  train_lib.train_and_evaluate(tiny_lm_config.get_config(), workdir)
  return workdir


def _eval_cli(*args):
  cmd = [sys.executable, os.path.join(REPO, "eval.py"), *args]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=PATIENCE_S)


def test_bad_prompts_are_clear_errors():
  tok = CharTokenizer.train(TEXTS)
  assert sample.check_prompts(tok, ["And God"], 8, 32) == [tok.encode("And God")]
  for prompts, new, message in (
    ([""], 8, "--prompt is empty"),
    (["And€"], 8, "outside the vocabulary: '€'"),
    (["And God"], 30, "exceed the model's max_len=32; ask for at most 25"),
    (["And"], 0, "max_new_tokens=0"),
  ):
    with pytest.raises(ValueError, match=message):
      sample.check_prompts(tok, prompts, new, 32)


def test_eval_cli_samples_and_reports_bad_input_in_one_line(trained_lm, tmp_path):
  ok = _eval_cli(
    f"--workdir={trained_lm}", "--prompt=ROMEO:", "--num_samples=2", "--max_new_tokens=8"
  )
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert ok.stdout.count("--- 'ROMEO:' ---") == 2
  assert "perplexity" in ok.stdout
  bad = _eval_cli(f"--workdir={trained_lm}", "--prompt=ROMEO€")
  assert bad.returncode == 1 and "Traceback" not in bad.stderr
  assert bad.stderr.strip().splitlines()[-1] == (
    "error: prompt 'ROMEO€' has characters outside the vocabulary: '€'"
  )
  empty = _eval_cli(f"--workdir={tmp_path}")
  assert empty.returncode == 1 and "no saved config" in empty.stderr


def test_evaluation_and_final_sample_compile_in_a_background_thread(tmp_path):
  """The run compiles its evaluation step and its final sample's decoding loop in the
  'compile-ahead' thread while it trains: once the updates start, the loop's own thread
  compiles neither (the persistent cache off here, so every program is compiled)."""
  import threading

  import jax
  import tiny_lm_config
  from jax._src import dispatch

  config = tiny_lm_config.get_config()
  config.evaluate.sample.max_new_tokens = 8  # a final sample
  config.eval_every = 3  # an evaluation during training, and one at the end
  config.compilation_cache_dir = ""
  phase, compiled = ["start"], []

  def on_compile(event, duration, **kwargs):
    if event == dispatch.BACKEND_COMPILE_EVENT and phase[0] != "done":
      compiled.append((threading.current_thread().name, phase[0], kwargs.get("fun_name", "")))

  jax.monitoring.register_event_duration_secs_listener(on_compile)
  hooks = train_lib.Hooks(phase=lambda name, step: phase.__setitem__(0, name))
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    train_lib.train_and_evaluate(config, str(tmp_path / "run"), hooks)
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
    phase[0] = "done"
  ahead = [name for thread, _, name in compiled if thread == "compile-ahead"]
  assert any("eval_step" in n for n in ahead) and any("lm_decode" in n for n in ahead), compiled
  late = [(p, n) for thread, p, n in compiled if thread != "compile-ahead" and p != "build"]
  late = [(p, n) for p, n in late if p != "restore"]  # the train step, before the updates
  assert not any("eval_step" in n or "lm_decode" in n for _, n in late), late
