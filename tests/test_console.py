"""The console: the training line's format, progress of long phases, the parameter overview,
and LM sampling that fits the model's context (capped, or a sliding window past it)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from conftest import make_random_params, make_tiny_config, param_shapes

from transformer import decode, eval_main
from transformer.data import builders
from transformer.data.progress import Timed, format_duration, progress
from transformer.decode.sliding import generate_sliding
from transformer.eval.evaluate import restore
from transformer.nn.models import build_model, param_count
from transformer.nn.sizes import named
from transformer.train import telemetry
from transformer.train.metric_writers import format_eval_line, format_train_line
from transformer.train.overview import parameter_overview


def test_the_training_line_has_step_loss_lr_throughput_mfu_and_eta_only():
  scalars = {
    "loss": 2.64417,
    "learning_rate": 1e-3,
    "tokens_per_sec": 10_321.0,
    "mfu": 0.3124,
    "grad_norm": 0.71,  # files only
    "examples_per_sec": 161.0,  # files only
  }
  line = format_train_line(100, 2000, scalars, eta_seconds=141.2)
  assert line == "step 100/2000 | loss 2.644 | lr 1.0e-03 | 10.3k tok/s | MFU 31.2% | ETA 2:21"
  # MFU where known only; no ETA before a rate exists; an unknown total.
  assert format_train_line(
    1, 2000, {"loss": 4.2, "learning_rate": 5e-4, "tokens_per_sec": 950.0}
  ) == ("step 1/2000 | loss 4.2 | lr 5.0e-04 | 950.0 tok/s")
  assert format_train_line(7, None, {"loss": 1.0}, 3725.0) == "step 7 | loss 1 | ETA 1:02:05"
  # A non-finite loss is shown; a non-finite learning rate (no schedule) or MFU is not.
  assert format_train_line(
    3, 9, {"loss": math.nan, "learning_rate": math.nan, "mfu": math.inf}
  ) == ("step 3/9 | loss nan")
  assert format_train_line(5, 10, {"tokens_per_sec": 2.5e6}) == "step 5/10 | 2.5M tok/s"
  assert format_eval_line("eval", 500, {"loss": 2.00312, "perplexity": 7.4112, "nll": 2.0}) == (
    "eval @ step 500 | loss 2.003 | ppl 7.411"
  )
  assert format_eval_line("eval_ema", 4, {"accuracy": 0.5, "bleu": 21.37, "tokens": 9.0}) == (
    "eval_ema @ step 4 | acc 0.5 | bleu 21.37"
  )
  assert [format_duration(s) for s in (0, 59.4, 61, 3599.6, 3600, 90061)] == [
    "0:00", "0:59", "1:01", "1:00:00", "1:00:00", "25:01:01"
  ]  # fmt: skip
  with pytest.raises(ValueError, match="seconds must be finite"):
    format_duration(-1.0)


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def _ticking(n: int, clock: _Clock, seconds_each: float):
  for i in range(n):
    clock.now += seconds_each
    yield i


def test_progress_prints_only_for_long_phases_every_tenth_or_ten_seconds():
  clock, lines = _Clock(), []
  items = list(progress(_ticking(50, clock, 0.01), 50, "short", print_fn=lines.append, clock=clock))
  assert items == list(range(50)) and lines == []  # 0.5 s: silent

  clock, lines = _Clock(), []
  run = progress(_ticking(100, clock, 1.0), 100, "evaluating", print_fn=lines.append, clock=clock)
  assert list(run) == list(range(100))
  # First line after the 5 s delay, then every 10% (10 items = 10 s here), then "done".
  assert lines[0] == "evaluating: 5/100 (5%) | 1/s | ETA 1:35"
  assert lines[1] == "evaluating: 15/100 (15%) | 1/s | ETA 1:25"
  assert len(lines) == 11 and lines[-2].startswith("evaluating: 95/100 (95%)")
  assert lines[-1] == "evaluating: done, 100 in 100.0s"

  clock, lines = _Clock(), []  # no total: count and rate, every 10 s
  list(progress(_ticking(30, clock, 2.0), None, "BLEU", print_fn=lines.append, clock=clock))
  assert lines == ["BLEU: 3 | 0.5/s", "BLEU: 8 | 0.5/s", "BLEU: 13 | 0.5/s", "BLEU: 18 | 0.5/s",
                   "BLEU: 23 | 0.5/s", "BLEU: 28 | 0.5/s", "BLEU: done, 30 in 60.0s"]  # fmt: skip
  clock, lines = _Clock(), []
  list(
    progress(_ticking(30, clock, 2.0), 30, "x", enabled=False, print_fn=lines.append, clock=clock)
  )
  assert lines == []  # not process 0

  clock, lines = _Clock(), []
  with Timed("training the SentencePiece tokenizer", print_fn=lines.append, clock=clock):
    clock.now = 75.0
  assert lines == [
    "training the SentencePiece tokenizer ...",
    "training the SentencePiece tokenizer: done in 1:15",
  ]


@pytest.mark.parametrize("size", ["gpt2_small", "bert_base", "transformer_base", "vit_b/16"])
def test_parameter_overview_totals_equal_param_count(size):
  c = named(size)
  overview = parameter_overview(param_shapes(c))
  assert overview.total_count == param_count(c)
  assert overview.total_bytes == 4 * param_count(c)  # float32 parameters
  assert sum(r.count for r in overview.rows) == overview.total_count
  table = overview.table()
  assert table.splitlines()[-1] == (
    f"total: {param_count(c):,} parameters, {overview.total_bytes / 2**20:.1f} MiB in "
    f"{len(overview.rows)} modules"
  )
  if size == "gpt2_small":  # one row per module: its parameters' shapes, count and bytes
    row = next(r for r in overview.rows if r.module == "decoder/layer_0/ffn/wi")
    assert dict(row.shapes) == {"kernel": (768, 3072), "bias": (3072,)}
    assert row.count == 768 * 3072 + 3072 and row.bytes == 4 * row.count
    assert "| decoder/layer_0/ffn/wi " in table and "kernel [768, 3072]" in table


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_sliding_generation_goes_past_the_context_and_matches_cached_decoding_within_it(position):
  """max_len 16: prompts of 3 and 5 tokens. Within the context the sliding window holds the
  whole sequence from position 0, so greedy tokens equal cached decoding's; past it, the
  requested number of tokens comes out."""
  c = make_tiny_config("decoder", position=position, dropout_rate=0.0)
  model = build_model(c)
  params = make_random_params(model, jnp.zeros((1, 4), jnp.int32), seed=1)
  prompts = [[5, 9, 12], [7, 3, 30, 2, 11]]
  fits = c.max_len - 5  # new tokens that fit after the longest prompt
  cached = decode.generate(model, params, prompts, max_new_tokens=fits, eos_id=None)
  slid = generate_sliding(model, params, prompts, max_new_tokens=30, eos_id=None)
  assert slid.tokens.shape == (2, 30) and np.all(np.asarray(slid.lengths) == 30)
  np.testing.assert_array_equal(np.asarray(slid.tokens)[:, :fits], np.asarray(cached.tokens))
  # Past the window: token i of a row sees the last 16 tokens, recomputed from position 0.
  row = list(prompts[1]) + [int(t) for t in np.asarray(slid.tokens)[1]]
  at = 5 + 27  # new token 27 of row 1
  window = np.asarray(row[at - c.max_len : at], np.int32)[None]  # [1, W]
  logits = model.apply({"params": params}, window)[0, -1]  # [V]
  assert int(jnp.argmax(logits)) == row[at] == int(np.asarray(slid.tokens)[1, 27])
  with pytest.raises(ValueError, match="sliding window decodes 'greedy' or 'sample'"):
    generate_sliding(model, params, prompts, max_new_tokens=4, method="beam")


def _eval(*args: str) -> None:
  try:
    flags.FLAGS(["eval.py", *args])
    eval_main._run()
  finally:
    flags.FLAGS.unparse_flags()


def _text(tokenizer, tokens) -> str:
  ids = [int(t) for t in np.asarray(tokens)[0]]
  return tokenizer.decode(ids[: ids.index(tokenizer.eos_id)] if tokenizer.eos_id in ids else ids)


def test_eval_py_prompt_on_a_short_context_model_caps_by_default_and_can_slide(
  trained, tmp_path, capsys
):
  """The tiny LM has max_len 32: `eval.py --prompt` with the default 200 new tokens caps
  them to the context with a note; --past_context=slide generates past it through a
  sliding window. Greedy (temperature 0), so each sample equals a direct decoding."""
  workdir = str(tmp_path / "run")
  shutil.copytree(trained["workdir"], workdir)  # the shared run stays as it is
  s, state, step = restore(workdir)
  tok, ids = s.info.tokenizer, [s.info.tokenizer.encode("ROMEO:")]
  cached = decode.generate(s.model, state.params, ids, max_new_tokens=26, eos_id=tok.eos_id)
  slid = generate_sliding(s.model, state.params, ids, max_new_tokens=70, eos_id=tok.eos_id)

  _eval(f"--workdir={workdir}", "--prompt=ROMEO:", "--temperature=0")
  out = capsys.readouterr().out
  note = "note: 200 new tokens capped to 26: the model's context is max_len=32 tokens"
  assert note in out and f"--- 'ROMEO:' ---\nROMEO:{_text(tok, cached.tokens)}\n" in out
  with open(os.path.join(workdir, f"eval_step_{step}.json")) as f:
    result = json.load(f)
  assert result["notes"][0].startswith(note)
  assert result["samples"][0]["generation"] == "cached"

  _eval(
    f"--workdir={workdir}", "--prompt=ROMEO:", "--temperature=0", "--max_new_tokens=70",
    "--past_context=slide",
  )  # fmt: skip
  out = capsys.readouterr().out
  assert "note:" not in out
  head = "--- 'ROMEO:' (sliding window of 32 tokens) ---\nROMEO:"
  assert f"{head}{_text(tok, slid.tokens)}\n" in out
  with open(os.path.join(workdir, f"eval_step_{step}.json")) as f:
    (sample,) = json.load(f)["samples"]
  assert sample["generation"] == "sliding window of 32 tokens"
  # Within the context the window's greedy tokens are the cached decoding's.
  n = int(min(np.asarray(cached.lengths)[0], np.asarray(slid.lengths)[0]))
  np.testing.assert_array_equal(np.asarray(slid.tokens)[0, :n], np.asarray(cached.tokens)[0, :n])


def test_peak_flops_come_from_the_config_the_table_or_a_timed_matmul_only_when_asked():
  assert telemetry.table_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
  assert telemetry.table_peak("NVIDIA H100 PCIe", "bfloat16") == 756.0e12  # longest prefix
  assert telemetry.table_peak("NVIDIA H200", "float32") == 494.7e12  # TF32 tensor cores
  assert telemetry.table_peak("NVIDIA A100-SXM4-80GB", "bfloat16") == 312.0e12
  assert telemetry.table_peak("TPU v5 lite", "bfloat16") == 197.0e12  # v5e
  assert telemetry.table_peak("TPU v5", "bfloat16") == 459.0e12  # v5p
  assert telemetry.table_peak("TPU v6 lite", "bfloat16") == 918.0e12
  assert telemetry.table_peak("TPU v4", "float32") == 275.0e12
  assert telemetry.table_peak("cpu", "float32") is None
  assert telemetry.table_peak("NVIDIA H100 80GB HBM3", "int8") is None
  assert jax.devices()[0].platform == "cpu"  # the tests run on the CPU: no table entry
  assert telemetry.peak_flops(2e9, False, "float32") == (2e9, "config.peak_flops")
  peak, why = telemetry.peak_flops(0.0, False, "float32")
  assert peak is None and "set peak_flops or measure_peak_flops" in why
  peak, why = telemetry.peak_flops(0.0, True, "float32")
  assert peak > 1e6 and why == "a timed float32 matmul on cpu"
  assert telemetry.mfu(100.0, 1e6, 1e9, 2) == pytest.approx(0.05)


def test_preparing_a_local_dataset_logs_no_custom_configuration_warning(tmp_path, caplog):
  """TFDS warns "Using custom data configuration: <config>" for every config its builder
  class does not list: every local dataset. `builders.prepare` drops that one record."""
  text = tmp_path / "corpus.txt"
  text.write_text("".join(f"line {i} of a small corpus\n" for i in range(200)))
  notice = "Using custom data configuration"
  with caplog.at_level(logging.INFO):
    builder = builders.text_corpus(text, tmp_path / "tfds", validation_fraction=0.1)
    assert builder.info.splits["train"].num_examples > 0
    assert not [r for r in caplog.records if notice in r.getMessage()]
    builders.LocalTextCorpus(config=builder.builder_config, data_dir=str(tmp_path / "tfds"))
  assert [r for r in caplog.records if notice in r.getMessage()]  # what it would have said
