"""Blocks of settings that several recipes in configs/ share, one function a block.

Not a config (no `get_config`): a recipe loads it by path from beside itself, as configs
are files rather than a package, so this works from any working directory and from an
installed copy of configs/:

  common = load_module(Path(__file__).with_name("common.py"), "configs_common")

Each function sets the fields its docstring names, on the ConfigDict (or its `model` /
`data` block) it is given, and nothing else; what is specific to a recipe stays in it.
`named_size`, `from_hf` and `plain_vit` start the recipe's config: they return one.
"""

from __future__ import annotations

from pathlib import Path

from ml_collections import ConfigDict

from transformer.nn.sizes import NAMED_SIZES
from transformer.train.experiment import default_config, task_block

BIBLE_TSV = "data/bible_kjv_rv1909_en_es.tsv.gz"  # KJV and Reina-Valera 1909, verse-aligned
SHAKESPEARE = "data/tinyshakespeare.txt.gz"


def check_arg(file: str, arg, allowed: tuple, what: str = "size") -> None:
  """A ValueError naming the config `file` (its `__file__`) unless `arg` is in `allowed`."""
  if arg not in allowed:
    raise ValueError(f"configs/{Path(file).name}: {what} must be one of {allowed}, got {arg!r}")


def named_size(file: str, arg: str, sizes: tuple[str, ...], family: str) -> ConfigDict:
  """`default_config()` with the model of `NAMED_SIZES[f"{family}_{arg}"]` in lower case
  (transformer/nn/sizes.py, which cites each size's source) and the vocabulary from the
  tokenizer; a ValueError naming the config `file` unless `arg` is one of `sizes`."""
  check_arg(file, arg, sizes)
  config = default_config()
  config.model.update(NAMED_SIZES[f"{family}_{arg}".lower()])
  config.model.vocab_size = 0
  return config


def from_hf(arg: str | None, default_dir: str) -> ConfigDict:
  """`default_config()` that starts from the Hugging Face directory `arg` (None: the
  recipe's `default_dir`): `init_from='hf:DIR'` brings the model config and weights, and
  the tokenizer where the directory has one; the recipe sets the run and runtime fields."""
  config = default_config()
  config.init_from = f"hf:{arg or default_dir}"
  return config


# --- models -------------------------------------------------------------------------------


def plain_vit(
  *, image_size: int, channels: int, patch_size: int, width: int, depth: int, heads: int
) -> ConfigDict:
  """`default_config()` with a small ViT trained from scratch as in Beyer et al. 2022
  ("Better plain ViT baselines"): 2-D sin-cos positions over the patch grid, global
  average pooling (no [CLS] token), FFN 2 * width, no dropout (augmentation or the run's
  length regularise); `max_len` is the patch count, the number of classes comes from the
  data."""
  config = default_config()
  m = config.model
  m.family = "vit"
  m.image_size = image_size
  m.num_channels = channels
  m.patch_size = patch_size
  m.d_model = width
  m.num_heads = heads
  m.num_layers = depth
  m.d_ff = 2 * width
  m.max_len = (image_size // patch_size) ** 2  # validated against the patch grid
  m.position = "sinusoidal"
  m.pooling = "mean"
  m.num_classes = 0
  m.dropout_rate = 0.0
  return config


def small_model(m: ConfigDict, family: str, num_layers: int) -> None:
  """The toy size the shipped-data recipes share: `num_layers` blocks (per stack) of width
  128, 4 heads, FFN 4 * 128; the vocabulary from the tokenizer."""
  m.update(family=family, vocab_size=0, d_model=128, num_heads=4, num_layers=num_layers, d_ff=512)


def nanogpt_char_model(m: ConfigDict) -> None:
  """nanoGPT's shakespeare_char model at its CPU size: a decoder of n_layer=4 blocks,
  n_head=4, n_embd=128 (FFN 4 * 128), block_size=64 learned positions (wpe), no dropout;
  the vocabulary from the character tokenizer."""
  small_model(m, "decoder", 4)
  m.max_len = 64  # positions beyond the trained context would stay untrained
  m.position = "learned"
  m.dropout_rate = 0.0


def small_bible_encoder(m: ConfigDict) -> None:
  """The encoder of configs/mlm_bible.py (4 blocks of width 128, 4 heads, learned
  positions), which configs/classify_testament.py fine-tunes: the same shapes, so every
  pretrained tensor is copied. The vocabulary from the SentencePiece tokenizer."""
  small_model(m, "encoder", 4)
  m.max_len = 128  # the position table: both recipes need the same rows to share it
  m.position = "learned"


def small_translation_model(m: ConfigDict) -> None:
  """The encoder-decoder of configs/translate_en_es.py, which configs/span_bible.py
  pretrains (a test checks they match): "Attention Is All You Need" at toy size, 3 + 3
  blocks of width 128, sinusoidal positions (Vaswani et al. 2017, 3.5), ReLU, one
  embedding for source, target and logits; the vocabulary from the shared tokenizer."""
  small_model(m, "seq2seq", 3)
  m.num_decoder_layers = 3
  m.max_len = 96  # longest source / target (decoding included)
  m.position = "sinusoidal"
  m.norm_position = "pre"  # trains stably at a high learning rate
  m.activation = "relu"
  m.tie_embeddings = True
  m.scale_embeddings = True  # tokens * sqrt(D), as the paper: else positions drown them out


# --- data ---------------------------------------------------------------------------------


def image_classification(d: ConfigDict, source: str) -> None:
  """Image classification batches of pixels (no tokenizer) from `source`."""
  d.kind = "image"
  d.source = source
  d.tokenizer = "none"


def sklearn_digits(d: ConfigDict) -> None:
  """scikit-learn's 8x8 digits (written as IDX files at first use): the first 1,437 to
  train on, the last 360 evaluated; no validation split."""
  image_classification(d, "sklearn_digits")
  d.eval_split = "test"
  d.validation_fraction = 0.0
  d.test_fraction = 0.0  # the test split is fixed by the source


def lm1b_sentencepiece(d: ConfigDict, vocab_size: int) -> None:
  """The TFDS dataset lm1b (train and test only: evaluated on test) with a SentencePiece
  vocabulary of `vocab_size` trained on its training split at first use."""
  d.source = "tfds"
  d.path = "lm1b"
  d.eval_split = "test"
  d.tokenizer = "sentencepiece"
  d.vocab_size = vocab_size


def shakespeare_text(d: ConfigDict) -> None:
  """The shipped tiny shakespeare as one token stream, its last 10% for validation (as
  nanoGPT), no test split."""
  d.source = "text"
  d.path = SHAKESPEARE
  d.validation_fraction = 0.1
  d.test_fraction = 0.0


def shakespeare_chars(d: ConfigDict) -> None:
  """`shakespeare_text` over a character vocabulary, evaluated 128 rows at a time."""
  shakespeare_text(d)
  d.tokenizer = "char"
  d.eval_batch_size = 128


def bible_sentencepiece(d: ConfigDict) -> None:
  """The bible recipes' one SentencePiece size: 4,000 pieces (the 7 special ids
  included), so that `data.tokenizer_from` finds a pretraining run's model (it looks the
  file up by this size)."""
  d.tokenizer = "sentencepiece"
  d.vocab_size = 4000


def bible_testament_labels(d: ConfigDict) -> None:
  """The KJV verses of the shipped bible TSV, labelled Old / New Testament."""
  d.source = "labelled"
  d.path = BIBLE_TSV
  d.text_column = "en"
  d.label_column = "testament"
  d.label_names = ("OT", "NT")  # label ids 0 and 1


def bible_pairs(d: ConfigDict) -> None:
  """English -> Spanish verse pairs of the shipped bible TSV (KJV -> Reina-Valera 1909)."""
  d.source = "pairs"
  d.path = BIBLE_TSV
  d.source_column = "en"
  d.target_column = "es"


def bible_translation(d: ConfigDict) -> None:
  """`bible_pairs` as translation pairs, evaluated (loss and BLEU) on the 1,574 held-out
  test pairs, 64 at a time."""
  d.kind = "seq2seq"
  bible_pairs(d)
  d.eval_split = "test"
  d.eval_batch_size = 64


# --- optimisation and the run -------------------------------------------------------------


def clipped_cosine(
  config: ConfigDict,
  warmup_steps: int,
  final_fraction: float = 0.0,
  *,
  learning_rate: float | None = None,
  b2: float | None = None,
  eps: float | None = None,
  weight_decay: float | None = None,
) -> None:
  """The recipes' usual optimisation: AdamW (betas (0.9, `b2`), `eps`, decoupled
  `weight_decay`) with the update clipped to global norm 1.0, linear warmup over
  `warmup_steps` to the peak `learning_rate`, then cosine decay to `final_fraction` of
  it. A field given as None keeps its value: the default's, or what the recipe sets."""
  adamw = {"b2": b2, "eps": eps, "weight_decay": weight_decay}
  config.optimizer.update({k: v for k, v in adamw.items() if v is not None}, clip_norm=1.0)
  config.schedule.update(kind="cosine", warmup_steps=warmup_steps, final_fraction=final_fraction)
  if learning_rate is not None:
    config.schedule.learning_rate = learning_rate


def nanogpt_adamw(config: ConfigDict, learning_rate: float) -> None:
  """nanoGPT's shakespeare_char optimizer at peak `learning_rate`: AdamW betas (0.9,
  0.99), eps 1e-8 (torch's default), weight decay 0.1, clipping at 1.0; 100 warmup steps,
  then cosine decay to a tenth of the peak."""
  clipped_cosine(config, 100, 0.1, learning_rate=learning_rate, b2=0.99, eps=1e-8, weight_decay=0.1)


def bert_adam(config: ConfigDict) -> None:
  """BERT's optimizer (Devlin et al. 2019): Adam betas (0.9, 0.999), eps 1e-6, decoupled
  weight decay 0.01, clipping at 1.0, warmup then cosine decay (the paper's is linear)."""
  config.optimizer.b2 = 0.999
  config.optimizer.eps = 1e-6
  config.optimizer.weight_decay = 0.01
  config.optimizer.clip_norm = 1.0
  config.schedule.kind = "cosine"


def evaluate_and_checkpoint(config: ConfigDict, every: int, batches: int = 0) -> None:
  """Evaluates every `every` updates on `batches` batches (0: the whole split) and
  checkpoints at the same updates, so that each checkpoint has the score that ranks it
  (`best_metric`; one saved without metrics is kept only while among the newest)."""
  config.eval_every = every
  config.eval_batches = batches
  config.checkpoint_every = every


def keep_most_accurate(config: ConfigDict) -> None:
  """Keeps the checkpoint of the best evaluation accuracy besides the newest ones."""
  config.best_metric = "accuracy"
  config.best_mode = "max"


def digits_run(config: ConfigDict) -> None:
  """The digits recipes' run: 300 updates of 64 images (about 13 epochs, seconds on a
  CPU), one evaluation on the whole test split and one checkpoint, both at the end; the
  most accurate checkpoint is kept."""
  config.update(num_train_steps=300, batch_size=64, log_every=50)
  config.update(eval_every=0, eval_batches=0, checkpoint_every=300)
  keep_most_accurate(config)


def shakespeare_finetune_run(config: ConfigDict) -> None:
  """The run of the Hugging Face LM fine-tunes (finetune_gpt2_shakespeare,
  finetune_llama_shakespeare): 200 updates of 8 windows of 64 tokens, warmup over the
  first 20 then cosine decay to a tenth of the peak, clipping at 1.0; 20 evaluation
  batches of 32 windows and a checkpoint every 100 updates, 32 tokens sampled at the end."""
  config.data.eval_batch_size = 32
  clipped_cosine(config, 20, 0.1)
  config.update(num_train_steps=200, batch_size=8, seq_len=64, log_every=20)
  evaluate_and_checkpoint(config, 100, batches=20)
  config.evaluate.sample.max_new_tokens = 32


def testament_classification(config: ConfigDict) -> None:
  """The testament classifiers' task and run (classify_testament, finetune_bert_testament):
  `bible_testament_labels` as [CLS] verse -> label, test accuracy over the whole test
  split (no model selection on it: the last checkpoints are kept); 600 updates of 32
  rows of 64 tokens (0.7 epochs of the 28,041 training verses), AdamW eps 1e-6 and weight
  decay 0.01 as BERT, clipping at 1.0, warmup over 10% then cosine decay to 0, one
  checkpoint at the end."""
  config.data.kind = "classification"
  bible_testament_labels(config.data)
  config.data.eval_split = "test"
  config.data.eval_batch_size = 128
  clipped_cosine(config, 60, eps=1e-6, weight_decay=0.01)
  config.update(num_train_steps=600, batch_size=32, seq_len=64, log_every=100)
  config.update(eval_batches=0, checkpoint_every=600, best_metric="")


def span_corruption_pretraining(config: ConfigDict, every: int) -> None:
  """T5's objective (Raffel et al. 2020; transformer/tasks/span_corruption.py) as the
  span-corruption recipes pretrain with it: sentinels replace dropped spans and the targets
  restore them, no dropout (T5.1.1; fine-tuning sets its own), decoupled weight decay 0.01
  (not on norms or embeddings), 32 windows a batch, 20 evaluation batches and a checkpoint
  every `every` updates."""
  config.model.dropout_rate = 0.0
  config.data.kind = "span_corruption"
  config.task = task_block("span_corruption")  # noise_density 0.15, mean_span_length 3
  config.optimizer.weight_decay = 0.01
  config.batch_size = 32
  evaluate_and_checkpoint(config, every, batches=20)


def short_translation_adamw(config: ConfigDict) -> None:
  """The bible translation model's optimizer (translate_en_es, and span_bible that
  pretrains it): AdamW betas (0.9, 0.98) and eps 1e-9 (Vaswani et al. 2017, 5.3),
  clipping at 1.0, and for a short run a cosine schedule in place of the paper's: peak
  2e-3 after 200 warmup steps, decay to 1e-4. The weight decay is the recipe's."""
  clipped_cosine(config, 200, 0.05, learning_rate=2e-3, b2=0.98, eps=1e-9)
