"""Every config in configs/ has a pulse.

Each config file loads with every documented argument and validates; then it trains two
steps at tiny sizes through `train_lib.train_and_evaluate`, on its own data: the shipped
files, or, for a config that names a standard TFDS dataset (`TFDS_CONFIGS`), that dataset
under `tfds.testing.mock_data` (tests/test_tfds_configs.py). A config that starts from a
Hugging Face directory (`init_from='hf:DIR'`) gets one written by scripts/make_tiny_hf.py
(`tiny_hf_dirs`, at the sizes `tiny()` shrinks to). A config file that is added without an
entry in `RECIPES` fails `test_every_config_is_covered`.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from transformer.data import sources
from transformer.train import experiment
from transformer.train import loop as train_lib

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
_DIGITS_VIT = dict(image_size=8, patch_size=4, num_channels=1)  # 4 patches
_FASHION_VIT = dict(image_size=28, patch_size=14, num_channels=1)  # 4 patches
_RGB_VIT = dict(image_size=32, patch_size=16, num_channels=3)  # 4 patches
_RGB_32 = dict(image_size=32)  # images resized to the tiny model's 32 x 32
# Tiny random Hugging Face directories (scripts/make_tiny_hf.py), written by `tiny_hf_dirs`.
TINY_HF = Path(tempfile.gettempdir()) / f"transformer_tiny_hf_{os.getpid()}"
TINY_GPT2 = str(TINY_HF / "gpt2")
TINY_BERT, TINY_LLAMA = str(TINY_HF / "bert"), str(TINY_HF / "llama")
TINY_T5, TINY_VIT = str(TINY_HF / "t5"), str(TINY_HF / "vit")
TINY_MIXTRAL, TINY_GEMMA2 = str(TINY_HF / "mixtral"), str(TINY_HF / "gemma2")
TINY_DINOV2, TINY_MARIAN = str(TINY_HF / "dinov2"), str(TINY_HF / "marian")

# config file stem -> (documented args, data overrides, model overrides) for the tiny run.
RECIPES: dict[str, tuple[tuple, dict, dict]] = {
  "lm_shakespeare": ((None,), {}, {}),
  "lm_shakespeare_nanogpt": ((None,), {}, {}),  # the race's like-for-like config
  "lm_shakespeare_parquet": ((None,), {}, {}),  # data.source='hf': the shipped Parquet speeches
  "lm_shakespeare_moe": ((None,), {}, {"num_layers": 2}),  # layer 0 dense, layer 1 MoE
  "lm_shakespeare_mla": ((None,), {}, {"attention_head_dim": 16}),  # latent attention
  "lm_mixture": ((None,), {}, {}),  # data.mixture: the plays and the English verses, 70 : 30
  "gpt2": (("small", "medium", "large"), {}, {}),  # lm1b
  "bert": (("base", "large"), {}, {}),  # lm1b (mlm)
  "bert_sst2": ((None,), {}, {}),  # glue/sst2
  "transformer_wmt": (("base", "big"), {}, {}),  # wmt14_translate/de-en
  "vit": (("Ti/16", "S/16", "B/16"), _RGB_32, _RGB_VIT),  # imagenet2012
  "vit_cifar10": ((None,), {}, _RGB_VIT),  # cifar10
  "vit_fashion_mnist_tfds": ((None,), {}, _FASHION_VIT),  # fashion_mnist (TFDS)
  "mlm_bible": ((None,), {}, {}),
  "classify_testament": ((None,), {}, {}),  # fine-tuned from the mlm_bible run
  "translate_en_es": ((None, "long"), {}, {}),
  "vit_fashion_mnist": ((None,), {}, _FASHION_VIT),
  "vit_digits": ((None,), {}, _DIGITS_VIT),
  "t5_span_corruption": ((None,), {}, {}),
  "span_bible": ((None,), {}, {}),  # translate_en_es fine-tunes from it
  "prefix_lm_shakespeare": ((None,), {}, {}),
  "distill_shakespeare": ((None, "alone"), {}, {}),  # the teacher: an lm_shakespeare run
  "finetune_gpt2_shakespeare": ((TINY_GPT2,), {}, {}),  # hf: a tiny random GPT-2 directory
  "finetune_bert_testament": ((TINY_BERT,), {}, {}),  # hf: BertForMaskedLM
  "finetune_llama_shakespeare": ((TINY_LLAMA,), {}, {}),  # hf: LlamaForCausalLM
  "finetune_mixtral_shakespeare": ((TINY_MIXTRAL,), {}, {}),  # hf: MixtralForCausalLM (MoE)
  "finetune_gemma2_shakespeare": ((TINY_GEMMA2,), {}, {}),  # hf: Gemma2ForCausalLM
  "finetune_t5_en_es": ((TINY_T5,), {}, {}),  # hf: T5ForConditionalGeneration
  "finetune_marian_en_es": ((TINY_MARIAN,), {}, {}),  # hf: MarianMTModel (Opus-MT)
  "finetune_vit_digits": ((TINY_VIT,), {}, {"max_len": 5}),  # hf: 4 patches + [CLS]
  "finetune_dinov2_digits": ((TINY_DINOV2,), {}, {"max_len": 10}),  # hf: 28 px trained at 42
  "sft_arith": ((None,), {}, {}),  # data.kind='sft': the shipped arithmetic conversations
  "sft_chat": ((TINY_GPT2,), {}, {}),  # hf: the tiny GPT-2's chat template, LoRA
  "dpo_arith": ((None,), {}, {}),  # preference: pairs of an sft_arith run (test_preference.py)
}
# Configs whose data is a standard TFDS dataset: they train two steps on
# `tfds.testing.mock_data` in tests/test_tfds_configs.py (`TFDS_CONFIGS` checked below).
TFDS_CONFIGS = (
  "bert", "bert_sst2", "gpt2", "transformer_wmt", "vit", "vit_cifar10", "vit_fashion_mnist_tfds",
)  # fmt: skip


def make_tiny_hf():
  """scripts/make_tiny_hf.py as a module (the package does not import it)."""
  spec = importlib.util.spec_from_file_location("make_tiny_hf", REPO / "scripts/make_tiny_hf.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module", autouse=True)
def tiny_hf_dirs():
  """The Hugging Face directories the `hf:` recipes start from."""
  script = make_tiny_hf()
  texts = script.corpus(60)  # tokenizers in seconds
  dirs = (TINY_GPT2, TINY_BERT, TINY_LLAMA, TINY_MIXTRAL, TINY_GEMMA2, TINY_T5, TINY_VIT)
  for path in (*dirs, TINY_DINOV2, TINY_MARIAN):
    script.make(Path(path).name, path, texts=texts)
  yield
  shutil.rmtree(TINY_HF, ignore_errors=True)


def _load(stem: str):
  spec = importlib.util.spec_from_file_location(f"configs_{stem}", CONFIGS / f"{stem}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _get_config(stem: str, arg):
  module = _load(stem)
  return module.get_config() if arg is None else module.get_config(arg)


def tiny(stem: str, **loop):
  """The config of `stem` (default arg) shrunk to a two-step run on its own data, with the
  fields `loop` names ('evaluate.bleu.every' too) set."""
  _, data, model = RECIPES[stem]
  config = _get_config(stem, RECIPES[stem][0][0])
  m = config.model
  m.update(d_model=32, num_heads=2, num_kv_heads=None, num_layers=1, d_ff=64, max_len=32)
  if m.num_decoder_layers is not None:
    m.num_decoder_layers = 1
  m.update(scan_layers=False, remat_policy="none", dtype="float32", **model)
  d = config.data
  d.update(data)
  if d.tokenizer == "sentencepiece":
    d.update(vocab_size=200, tokenizer_train_examples=500)  # seconds, not minutes
  d.update(eval_batch_size=8, num_workers=0)
  config.schedule.warmup_steps = 1
  config.update(
    batch_size=8, seq_len=16, grad_accum_steps=1, num_train_steps=2, log_every=1, eval_every=0,
    eval_batches=1, checkpoint_every=2, parallelism="jit",
  )  # fmt: skip
  if d.kind in ("sft", "preference"):  # rows that hold a whole conversation, its answer too
    config.seq_len = m.max_len = 48
  no_decoding = {"evaluate.sample.max_new_tokens": 0, "evaluate.bleu.every": 0}
  no_decoding["evaluate.exact_match.examples"] = 16  # a few held-out answers
  config.update_from_flattened_dict({**no_decoding, **loop})  # loop: {'a.b': value} too
  return config


def test_every_config_is_covered():
  # configs/common.py holds the blocks the recipes share: a module, not a config.
  stems = sorted(p.stem for p in CONFIGS.glob("*.py") if p.stem not in ("__init__", "common"))
  assert stems == sorted(RECIPES), (
    "configs/ and tests/test_recipes.py RECIPES differ: add an entry (its documented "
    "args and the overrides that make it train on shipped data) for each new config"
  )


def test_tfds_configs_are_the_configs_that_name_a_tfds_dataset():
  named = sorted(s for s in RECIPES if _get_config(s, RECIPES[s][0][0]).data.source == "tfds")
  assert named == sorted(TFDS_CONFIGS)


@pytest.mark.parametrize("stem", sorted(RECIPES))
def test_config_loads_with_every_documented_arg(stem):
  module = _load(stem)
  args = RECIPES[stem][0]
  if hasattr(module, "SIZES"):
    assert tuple(module.SIZES) == args, f"configs/{stem}.py documents {module.SIZES}"
  for arg in args:
    config = _get_config(stem, arg)
    config.lock()
    exp = experiment.validate(config)  # every field valid before anything is built
    assert exp.loop.num_train_steps > 0
    doc = module.__doc__ or ""
    assert f"python train.py --config configs/{stem}.py" in doc, f"{stem}: no command in docstring"


def _two_step_run(tmp_path_factory, stem: str) -> str:
  """The workdir of a two-step run of `stem`."""
  workdir = str(tmp_path_factory.mktemp(stem))
  metrics = train_lib.train_and_evaluate(tiny(stem), workdir)
  assert math.isfinite(metrics["loss"])
  return workdir


def _fine_tune(stem: str, pretrained: str, workdir, caplog) -> None:
  """Two steps of `stem` in `workdir` from the run `pretrained` (its weights and its
  tokenizer), the INFO logs captured by `caplog`."""
  config = tiny(stem, init_from=pretrained)
  config.data.tokenizer_from = pretrained
  with caplog.at_level("INFO"):
    metrics = train_lib.train_and_evaluate(config, str(workdir))
  assert math.isfinite(metrics["loss"])


@pytest.fixture(scope="module")
def mlm_workdir(tmp_path_factory):
  """The two-step mlm_bible run that classify_testament fine-tunes from."""
  return _two_step_run(tmp_path_factory, "mlm_bible")


@pytest.fixture(scope="module")
def span_workdir(tmp_path_factory):
  """The two-step span_bible run that translate_en_es fine-tunes from."""
  return _two_step_run(tmp_path_factory, "span_bible")


@pytest.mark.parametrize(
  "stem",
  sorted(
    set(RECIPES)
    - {"mlm_bible", "classify_testament", "span_bible", "translate_en_es", *TFDS_CONFIGS}
    - {"distill_shakespeare", "dpo_arith"}
  ),
)
def test_config_trains_two_steps(stem, tmp_path):
  metrics = train_lib.train_and_evaluate(tiny(stem), str(tmp_path))
  assert math.isfinite(metrics["loss"]), metrics
  assert os.path.isdir(tmp_path / "checkpoints" / "2")


def test_classify_testament_fine_tunes_from_mlm_bible(mlm_workdir, tmp_path, caplog):
  _fine_tune("classify_testament", mlm_workdir, tmp_path, caplog)
  mlm_tok = sorted(Path(mlm_workdir, "tokenizers").rglob("*.model"))
  cls_tok = sorted(Path(tmp_path, "tokenizers").rglob("*.model"))
  assert len(mlm_tok) == len(cls_tok) == 1
  assert mlm_tok[0].read_bytes() == cls_tok[0].read_bytes()  # copied, not retrained
  logged = [r.getMessage() for r in caplog.records if "tensors copied" in r.getMessage()]
  assert len(logged) == 1, logged
  copied, total = map(int, re.search(r": (\d+) of (\d+) tensors copied", logged[0]).groups())
  assert copied == total - 4, logged  # all but the new pooler and classifier kernels / biases


def test_translate_en_es_fine_tunes_from_span_bible(span_workdir, tmp_path, caplog):
  """translate_en_es's two steps (from the span_bible run, its tokenizer and weights)."""
  _fine_tune("translate_en_es", span_workdir, tmp_path, caplog)
  logged = [r.getMessage() for r in caplog.records if "init_from" in r.getMessage()]
  copied, total = map(int, re.search(r": (\d+) of (\d+) tensors copied", logged[-1]).groups())
  assert copied == total, logged  # every tensor, the embedding too (without its sentinels)
  assert any("shared_embed/embedding keeps the first 200 ids" in line for line in logged), logged
  assert os.path.isdir(tmp_path / "checkpoints" / "2")


def test_distill_shakespeare_learns_from_an_lm_shakespeare_run(tmp_path):
  """distill_shakespeare's two steps, its teacher a two-step lm_shakespeare run."""
  teacher = str(tmp_path / "teacher")
  train_lib.train_and_evaluate(tiny("lm_shakespeare"), teacher)
  config = tiny("distill_shakespeare")
  config.task.teacher = teacher
  metrics = train_lib.train_and_evaluate(config, str(tmp_path / "student"))
  assert math.isfinite(metrics["loss"])
  assert os.path.isdir(tmp_path / "student" / "checkpoints" / "2")


def test_tokenizer_from_finds_the_file_or_names_what_is_there(tmp_path):
  run = tmp_path / "run"
  model = run / "tokenizers" / "some_data_key" / "spm_unigram_200.model"
  model.parent.mkdir(parents=True)
  model.write_bytes(b"x")
  assert sources.find_tokenizer(run, "spm_unigram_200.model") == model
  assert sources.find_tokenizer(model, "ignored") == model  # a file is taken as given
  with pytest.raises(FileNotFoundError, match=r"no spm_unigram_400\.model.*some_data_key"):
    sources.find_tokenizer(run, "spm_unigram_400.model")
  with pytest.raises(FileNotFoundError, match="no such file or folder"):
    sources.find_tokenizer(tmp_path / "missing", "spm_unigram_200.model")
  other = run / "tokenizers" / "other_key" / "spm_unigram_200.model"
  other.parent.mkdir()
  other.write_bytes(b"y")
  with pytest.raises(ValueError, match="several"):
    sources.find_tokenizer(run, "spm_unigram_200.model")
  assert sources.find_tokenizer(run, "spm_unigram_200.model", key="other_key") == other
