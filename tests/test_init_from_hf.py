"""`config.init_from='hf:DIR'`: fine-tuning a Hugging Face directory.

A tiny random GPT-2 with a byte-level BPE trained on a few lines of the shipped
Shakespeare (scripts/make_tiny_hf.py, nothing downloaded) is fine-tuned for 2 steps: the
model config, every weight, the tokenizer and the vocabulary size are the directory's,
so the first step's training loss is the imported model's own loss on that first batch.
A model field that conflicts with the checkpoint fails in one line before compiling.
The run records what the directory decided in its workdir, so once the directory is gone
the run still resumes and `eval.py` still evaluates it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from test_recipes import make_tiny_hf, tiny

from transformer import convert
from transformer.convert import tokenizers as pretrained
from transformer.eval.evaluate import evaluate
from transformer.evaluators.sample import SampleOptions
from transformer.tasks import losses
from transformer.train import experiment, setup
from transformer.train import loop as train_lib
from transformer.train import pretrained as pretrained_lib

FAMILIES = ("gpt2", "bert", "llama", "t5", "vit", "dinov2")
CHAT = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}me:"


@pytest.fixture(scope="module")
def script():
  return make_tiny_hf()


@pytest.fixture(scope="module")
def gpt2_dir(script, tmp_path_factory):
  return script.make("gpt2", tmp_path_factory.mktemp("hf") / "gpt2", texts=script.corpus(60))


def _config(gpt2_dir, **loop):
  config = tiny("finetune_gpt2_shakespeare", init_from=f"hf:{gpt2_dir}", **loop)
  config.model.update(dropout_rate=0.0, attention_dropout_rate=0.0)  # a deterministic step
  return config


class _Messages(logging.Handler):
  def __init__(self):
    super().__init__(logging.INFO)
    self.lines: list[str] = []

  def emit(self, record):
    self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def trained(gpt2_dir, tmp_path_factory):
  """(source, workdir, metrics, log lines) of 2 steps from a copy of the tiny GPT-2 (the
  same files, named gpt2 too), which the persistence test deletes."""
  root = tmp_path_factory.mktemp("trained")
  source = root / "gpt2"
  shutil.copytree(gpt2_dir, source)
  tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
  tokenizer_config["chat_template"] = CHAT  # kept with the run's tokenizer, for eval.py --chat
  (source / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
  messages, logger = _Messages(), logging.getLogger()
  level = logger.level
  logger.addHandler(messages)
  logger.setLevel(logging.INFO)
  try:
    metrics = train_lib.train_and_evaluate(_config(source), str(root / "run"))
  finally:
    logger.removeHandler(messages)
    logger.setLevel(level)
  return source, root / "run", metrics, messages.lines


def test_two_steps_start_from_the_imported_model(gpt2_dir, trained, tmp_path):
  _, workdir, metrics, messages = trained
  assert np.isfinite(metrics["loss"])
  hf_cfg, imported = convert.load(gpt2_dir)

  logged = [m for m in messages if "tensors copied" in m]
  assert len(logged) == 1, logged
  copied, total = map(int, re.search(r": (\d+) of (\d+) tensors copied", logged[0]).groups())
  assert copied == total == len(jax.tree.leaves(imported)), logged  # every weight

  # The tokenizer is the directory's, cached in the workdir; the vocabulary is the checkpoint's.
  saved = Path(workdir, "tokenizers", pretrained.filename())
  expected = tmp_path / "expected.json"
  pretrained.from_pretrained_dir(gpt2_dir).save(expected)
  want = json.loads(expected.read_text()) | {"chat_template": CHAT}  # the copy trained from
  assert json.loads(saved.read_text()) == want
  run_cfg = json.loads(Path(workdir, setup.MODEL_CONFIG_FILE).read_text())
  assert (
    run_cfg["vocab_size"]
    == hf_cfg.vocab_size
    == json.loads(Path(gpt2_dir, "config.json").read_text())["vocab_size"]
  )
  for field in ("d_model", "num_heads", "num_layers", "d_ff", "activation", "tie_embeddings"):
    assert run_cfg[field] == getattr(hf_cfg, field), field
  assert run_cfg["max_len"] == 32  # the config's (tiny), below the checkpoint's 64 positions

  # The first batch through the imported parameters, with the task's forward and loss.
  exp = experiment.validate(_config(gpt2_dir))
  s = setup.build(exp, str(tmp_path / "fresh"))
  batch = next(iter(s.train_iter))
  params = jax.tree.map(np.asarray, imported["params"])
  positions = params["embedder"]["positions"]
  positions["embedding"] = positions["embedding"][:32]  # the run's max_len
  logits, targets, weights = exp.task.apply(s.model, {"params": params}, batch)
  loss_sum, weight_sum, _ = losses.cross_entropy_with_label_smoothing(
    logits, targets, weights, 0.0, 0.0
  )
  expected_loss = float(loss_sum / weight_sum)
  lines = Path(workdir, "metrics.jsonl").read_text().splitlines()
  first = [json.loads(x) for x in lines if json.loads(x).get("split") == "train"][0]
  assert first["step"] == 1
  np.testing.assert_allclose(first["loss"], expected_loss, rtol=1e-5)


def test_a_conflicting_model_field_fails_in_one_line(gpt2_dir):
  config = _config(gpt2_dir)
  config.model.d_model = 48
  with pytest.raises(ValueError) as e:
    experiment.validate(config)
  message = str(e.value)
  assert "\n" not in message
  assert re.search(r"model\.d_model=48.*d_model=32", message), message


def test_runtime_fields_and_max_len_may_be_set(gpt2_dir):
  config = _config(gpt2_dir)
  config.model.update(dtype="bfloat16", dropout_rate=0.2, attention_impl="jax", max_len=16)
  exp = experiment.validate(config)
  assert (exp.model.dtype, exp.model.dropout_rate, exp.model.attention_impl) == (
    "bfloat16", 0.2, "jax",
  )  # fmt: skip
  assert (exp.model.max_len, exp.model.d_model, exp.model.num_layers) == (16, 32, 1)
  assert (exp.data.tokenizer, exp.data.tokenizer_from) == ("pretrained", str(gpt2_dir))
  config.model.max_len = 128  # beyond the checkpoint's 64 learned positions
  with pytest.raises(ValueError, match=r"model\.max_len=128.*64 learned positions"):
    experiment.validate(config)


def test_a_vit_at_another_image_size_fails_in_one_line(script, tmp_path):
  """ViT's learned positions are not resampled: a run's images of another size than the
  checkpoint's are refused before anything is built, naming the field that set the size."""
  path = script.make("vit", tmp_path / "vit")
  where = f"config.init_from='hf:{path}'"
  for field in ("data", "model"):
    config = tiny("finetune_vit_digits", init_from=f"hf:{path}")
    config.data.image_size = None
    config[field].image_size = 48
    with pytest.raises(ValueError) as e:
      experiment.validate(config)
    assert str(e.value) == (
      f"config.{field}.image_size=48: differs from the checkpoint's image_size=32, whose "
      f"learned positions are not resampled ({where}): use 32"
    )
  config = tiny("vit_digits")  # trained from scratch: the images must be the model's size
  config.data.image_size = 16
  with pytest.raises(
    ValueError, match=r"^config\.data\.image_size=16: must be model\.image_size=8$"
  ):
    experiment.validate(config)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_script_writes_directories_that_load(script, family, tmp_path):
  path = script.make(family, tmp_path / family, texts=script.corpus(60))
  cfg, params = convert.load(path)
  assert cfg.d_model == 32 and jax.tree.leaves(params)
  if family in script.TOKENIZERS:
    tok = pretrained.from_pretrained_dir(path)
    assert tok.vocab_size == cfg.vocab_size
    assert tok.decode(tok.encode("First Citizen")).replace(" ", "").lower() == "firstcitizen"


def test_the_run_resumes_and_evaluates_once_the_directory_is_gone(trained, tmp_path):
  source, trained_workdir, _, _ = trained
  workdir = str(tmp_path / "run")
  shutil.copytree(trained_workdir, workdir)  # (the other tests read the fixture's workdir)
  record = json.loads(Path(workdir, pretrained_lib.RECORD).read_text())
  assert record["init_from"] == f"hf:{source}" and record["tokenizer"] is True
  assert record["model"]["d_model"] == 32 and record["model"]["family"] == "decoder"
  shutil.rmtree(source, ignore_errors=True)
  with pytest.raises(ValueError, match=r"no config\.json"):  # it is gone indeed
    experiment.validate(_config(source))

  metrics = train_lib.train_and_evaluate(_config(source, num_train_steps=3), workdir)
  assert np.isfinite(metrics["loss"])
  lines = [json.loads(x) for x in Path(workdir, "metrics.jsonl").read_text().splitlines()]
  assert [x["step"] for x in lines if x.get("split") == "train"] == [1, 2, 3]  # resumed at 2
  result = evaluate(workdir, options={"sample": SampleOptions(max_new_tokens=4)})
  assert result["step"] == 3 and np.isfinite(result["loss"]), result
  prompt = {"sample": SampleOptions(prompts=("ROMEO:",), max_new_tokens=4)}
  chat = evaluate(workdir, options=prompt, chat=True)
  (sample,) = chat["samples"]
  assert sample["prompt"] == "user: ROMEO:<|endoftext|>me:"  # the template, from the record
