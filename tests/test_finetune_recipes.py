"""The fine-tune recipes (configs/finetune_*.py) start training from the imported model.

For BERT (testament classification), Llama (Shakespeare LM), T5 and Marian (en -> es
translation), ViT and DINOv2 (digits), a tiny random directory written by
scripts/make_tiny_hf.py is fine-tuned for 2 steps through its recipe. The first step's
training loss equals the imported model's own loss on that first batch, computed apart
with the task's forward and loss from the checkpoint's tensors (and, for a head the
checkpoint lacks, the run's fresh initial values), so training started from the imported
weights. BERT: every tensor but the fresh pooler and classifier is copied, rows are
`[CLS] text [SEP]` in the WordPiece ids (truncation keeps the [SEP]); the project's
tokenizers keep `[CLS] text`. T5: PAD 0, EOS 1 and the 100 sentinels of its SentencePiece
vocabulary reach the batches and the model as the checkpoint numbers them. Marian: the
first loss is also transformers' `MarianMTModel` (PyTorch, reading the directory itself)
on the batch's pairs in Marian's ids (our 0 and V - 1 swapped back to its PAD V - 1 and
EOS 0), so a PAD swap missing from the weights moves it; the rows are Marian's own
tokenization (`source.spm`, `vocab.json`) with the swap, so one missing from the
tokenizer fails too. ViT and DINOv2: no initial tensor of the directory is zero (no zero
head), so the first loss tells the checkpoint's weights from the run's fresh ones.
DINOv2: the recipe trains at another image size than the checkpoint's, so the imported
model is the one HF runs at that size, loaded with its position table resampled
(`convert.load(DIR, image_size=S)`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest
import sentencepiece as spm
import torch
import transformers
from test_recipes import make_tiny_hf, tiny

from transformer import convert
from transformer.convert import tokenizers as pretrained
from transformer.data import DataContext, features, pipeline, sources
from transformer.data.config import DataConfig
from transformer.data.tokenizers import CLS_ID, CharTokenizer
from transformer.nn import tree
from transformer.tasks import classification
from transformer.train import experiment, setup
from transformer.train import loop as train_lib

pytestmark = pytest.mark.one_worker  # the tiny HF folders are made once (conftest.py)

RECIPE = {  # family -> recipe
  "bert": "finetune_bert_testament",
  "llama": "finetune_llama_shakespeare",
  "mixtral": "finetune_mixtral_shakespeare",
  "gemma2": "finetune_gemma2_shakespeare",
  "t5": "finetune_t5_en_es",
  "marian": "finetune_marian_en_es",
  "vit": "finetune_vit_digits",
  "dinov2": "finetune_dinov2_digits",
}
FRESH_BERT_HEAD = {"pooler/kernel", "pooler/bias", "classifier/kernel", "classifier/bias"}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """family -> a tiny random Hugging Face directory (tokenizers on 60 lines: seconds)."""
  script = make_tiny_hf()
  root = tmp_path_factory.mktemp("hf")
  shakespeare = script.corpus(60)
  texts = {"marian": script.verses(30)}  # an English -> Spanish vocabulary
  return {f: script.make(f, root / f, texts=texts.get(f, shakespeare)) for f in RECIPE}


def _config(family: str, hf_dir: Path, **loop):
  config = tiny(RECIPE[family], init_from=f"hf:{hf_dir}", **loop)
  config.model.update(dropout_rate=0.0, attention_dropout_rate=0.0)  # a deterministic step
  return config


def _first_train_loss(workdir: Path) -> float:
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  first = [json.loads(x) for x in lines if json.loads(x).get("split") == "train"][0]
  assert first["step"] == 1
  return first["loss"]


def _copied(caplog) -> tuple[int, int]:
  logged = [r.getMessage() for r in caplog.records if "tensors copied" in r.getMessage()]
  assert len(logged) == 1, logged
  copied, total = re.search(r": (\d+) of (\d+) tensors copied", logged[0]).groups()
  return int(copied), int(total)


def _imported_params(hf_dir: Path, fresh, **changes) -> tuple[dict, set[str]]:
  """The tensors of the checkpoint loaded with `changes` (a ViT's image_size) where the
  model has the path (a learned position table cut to the run's max_len), the fresh ones
  elsewhere; and the paths that stayed fresh."""
  _, imported = convert.load(hf_dir, **changes)
  flat = jax.tree.leaves_with_path(imported["params"])
  source = {tree.path_str(k): np.asarray(v) for k, v in flat}
  kept = set()

  def pick(keypath, leaf):
    key = tree.path_str(keypath)
    if key not in source:
      kept.add(key)
      return np.asarray(leaf)
    value = source[key]
    if value.shape != leaf.shape:  # positions beyond the run's max_len
      assert "position" in key and value.shape[1:] == leaf.shape[1:], (key, value.shape)
      value = value[: leaf.shape[0]]
    return value

  return jax.tree_util.tree_map_with_path(pick, fresh), kept


def _task_loss(s, params, batch) -> float:
  """The task's forward pass and loss with `params`, apart from the train step."""

  @jax.jit
  def loss(params, batch):
    # The task's objective: its loss plus, for a MoE model, the router's losses.
    loss_sum, normalizer, _ = s.exp.task.objective(s.model, {"params": params}, batch, True, {})
    return loss_sum / normalizer

  return float(loss(params, batch))


def _fine_tune(family, hf_dir, tmp_path, caplog, **loop):
  """2 steps of the recipe, whose first training loss must be the imported model's loss on
  the first batch; returns (metrics, that batch, the setup that made it, the parameter
  paths left at their initial values)."""
  config = _config(family, hf_dir, **loop)
  with caplog.at_level("INFO"):
    metrics = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
  assert np.isfinite(metrics["loss"]), metrics
  exp = experiment.validate(_config(family, hf_dir, **loop))
  assert exp.task.options.label_smoothing == 0.0 and exp.task.options.z_loss == 0.0
  s = setup.build(exp, str(tmp_path / "fresh"))  # the same seed: the same batch and init
  batch = next(iter(s.train_iter))
  image = {"image_size": s.model_cfg.image_size} if exp.task.images else {}  # the run's
  params, kept = _imported_params(hf_dir, s.state.params, **image)
  expected = _task_loss(s, params, batch)
  np.testing.assert_allclose(_first_train_loss(tmp_path / "run"), expected, rtol=1e-5)
  return metrics, batch, s, kept


def test_bert_classifier_starts_from_the_checkpoint(hf_dirs, tmp_path, caplog):
  _, batch, s, kept = _fine_tune("bert", hf_dirs["bert"], tmp_path, caplog)
  # Every tensor but the fresh head: the MLM checkpoint has no pooler or classifier.
  assert kept == FRESH_BERT_HEAD
  copied, total = _copied(caplog)
  assert (copied, total) == (len(jax.tree.leaves(s.state.params)) - 4, copied + 4)

  # Rows are [CLS] text [SEP] in the WordPiece's ids, then padding.
  tok = pretrained.from_pretrained_dir(hf_dirs["bert"])
  assert s.info.tokenizer.present_specials() == tok.present_specials()
  inputs, seg = np.asarray(batch["inputs"]), np.asarray(batch["segment_ids"])
  lengths = (seg > 0).sum(1)  # [B]
  assert (inputs[:, 0] == tok.cls_id).all()
  assert (inputs[np.arange(len(inputs)), lengths - 1] == tok.sep_id).all()
  assert ((inputs == tok.sep_id).sum(1) == 1).all()  # one [SEP] per row, at the end
  assert (inputs[seg == 0] == tok.pad_id).all()
  assert (lengths == inputs.shape[1]).any(), "no truncated verse in the batch"


def test_classification_rows_end_with_sep_for_pretrained_vocabularies_only(hf_dirs):
  bert = pretrained.from_pretrained_dir(hf_dirs["bert"])
  text = "First Citizen: before we proceed any further, hear me speak."
  record = {"text": text.encode(), "label": 1}
  ids = bert.encode(text)
  assert len(ids) > 6
  cfg = DataConfig(kind="classification", source="labelled", tokenizer="pretrained",
                   tokenizer_from="x")  # fmt: skip
  sep = classification.row_sep_id(cfg, bert)
  assert sep == bert.sep_id
  assert classification.TextClassification.create(cfg, 8).pretrained
  long = features.Classification(bert, seq_len=8, sep_id=sep)((0, record))
  assert long["inputs"].tolist() == [bert.cls_id, *ids[:6], bert.sep_id]  # [SEP] kept
  short = features.Classification(bert, seq_len=32, sep_id=sep)((0, record))
  n = len(ids) + 2
  assert short["inputs"].tolist() == [bert.cls_id, *ids, bert.sep_id] + [0] * (32 - n)
  assert short["segment_ids"].tolist() == [1] * n + [0] * (32 - n)
  assert short["positions"].tolist()[:n] == list(range(n))
  with pytest.raises(ValueError, match="tokens exceed"):  # the budget counts the [SEP]
    features.Classification(bert, seq_len=len(ids) + 1, overlong="error", sep_id=sep)((0, record))

  # The project's tokenizers: `[CLS] text`, unchanged (its SEP id 6 is not appended).
  char = CharTokenizer.train([text])
  own = DataConfig(kind="classification", source="labelled")
  assert classification.row_sep_id(own, char) is None
  assert not classification.TextClassification.create(own, 8).pretrained
  splits = sources.Splits(train=[record], eval=[record], name="", key="")
  context = DataContext(own, splits, char, 80, 80, 0, pipeline.Loader())
  ds = classification.TextClassification().data_spec().build(context, False, 1)
  row = next(iter(ds))["inputs"][0].tolist()
  assert row == [CLS_ID, *char.encode(text)] + [0] * (80 - 1 - len(text))


def test_llama_lm_starts_from_the_checkpoint(hf_dirs, tmp_path, caplog):
  _, batch, s, kept = _fine_tune("llama", hf_dirs["llama"], tmp_path, caplog)
  copied, total = _copied(caplog)
  assert not kept and copied == total == len(jax.tree.leaves(s.state.params))
  tok = pretrained.from_pretrained_dir(hf_dirs["llama"])
  assert s.model_cfg.vocab_size == tok.vocab_size and s.model_cfg.position == "rope"
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])  # windows


@pytest.mark.parametrize("family", ["mixtral", "gemma2"])
def test_moe_and_gemma_lms_start_from_the_checkpoint(family, hf_dirs, tmp_path, caplog):
  """The MoE recipe's first loss includes Mixtral's balance loss (the router's, from the
  imported router weights); Gemma 2's runs through its soft caps and sandwich norms."""
  metrics, _, s, kept = _fine_tune(family, hf_dirs[family], tmp_path, caplog)
  copied, total = _copied(caplog)
  assert not kept and copied == total == len(jax.tree.leaves(s.state.params))
  c = s.model_cfg
  if family == "mixtral":
    assert (c.moe_experts, c.moe_top_k, c.moe_balance_loss) == (4, 2, 0.04)
    assert metrics["moe_balance_loss"] > 0
  else:
    assert (c.norm_position, c.logits_softcap, c.norm_scale_plus_one) == ("sandwich", 30.0, True)


def test_t5_translation_keeps_t5s_ids(hf_dirs, tmp_path, caplog):
  metrics, batch, s, kept = _fine_tune(
    "t5", hf_dirs["t5"], tmp_path, caplog, **{"evaluate.bleu.every": 2}
  )
  copied, total = _copied(caplog)
  assert not kept and copied == total == len(jax.tree.leaves(s.state.params))
  assert 0.0 <= metrics["bleu"] <= 100.0  # greedy decoding to T5's EOS, at the end

  tok = s.info.tokenizer
  pieces = tok.vocab_size - 100
  assert (tok.pad_id, tok.eos_id) == (0, 1)
  assert (tok.sentinel_id(0), tok.sentinel_id(99)) == (tok.vocab_size - 1, pieces)
  hf_vocab = json.loads((hf_dirs["t5"] / "config.json").read_text())["vocab_size"]
  assert s.model_cfg.vocab_size == tok.vocab_size == hf_vocab  # the sentinels' rows included
  assert s.info.config.tokenizer == "pretrained"

  # Packed training rows: each segment ends with EOS 1, padding is PAD 0, no sentinels.
  for side in ("inputs", "targets"):
    ids, seg = np.asarray(batch[side]), np.asarray(batch[f"{side}_segment_ids"])
    assert (ids[seg == 0] == 0).all() and (ids[seg > 0] != 0).all()
    ends = np.concatenate([seg[:, 1:] != seg[:, :-1], np.ones_like(seg[:, :1], bool)], 1)
    ends &= seg > 0  # [B, T] last token of each segment
    assert ends.any() and (ids[ends] == 1).all() and (ids[~ends & (seg > 0)] != 1).all()
    assert ids.max() < pieces  # text never encodes to a sentinel
  np.testing.assert_array_equal(batch["weights"], np.asarray(batch["targets_segment_ids"]) > 0)

  # Evaluation rows are one pair each: the source / target pieces + EOS 1, padded with 0.
  split = sources.open_splits(s.info.config, tmp_path / "fresh", paired=True).eval
  shard = pipeline.records(split, pipeline.Loader())
  rows = next(iter(s.eval_factory()))
  length = rows["inputs"].shape[1]
  for k in range(len(rows["inputs"])):
    _, record = shard[k]
    for side, column in (("inputs", "en"), ("targets", "es")):
      body = tok.encode(features.text_of(record, column))[: length - 1]
      pad = [0] * (length - len(body) - 1)
      assert rows[side][k].tolist() == [*body, 1, *pad], (k, side)


def _marian_ids(ids: np.ndarray, pad: int) -> np.ndarray:
  """Our ids -> Marian's and back: id 0 and Marian's PAD trade places."""
  return np.where(ids == 0, pad, np.where(ids == pad, 0, ids))


def _hf_marian_loss(hf_dir: Path, batch) -> float:
  """transformers' `MarianMTModel` (float32, from the directory's files) on each packed
  pair of `batch` in Marian's ids, alone, its decoder started from PAD: the target tokens'
  summed cross-entropy (float64) over their count, the task's unsmoothed loss."""
  model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
  pad = model.config.pad_token_id
  sides = ("inputs", "targets")
  ids = {side: np.asarray(batch[side]) for side in sides}  # [B, S], [B, T]
  seg = {side: np.asarray(batch[f"{side}_segment_ids"]) for side in sides}
  total, count = 0.0, 0
  for row in range(len(ids["targets"])):
    for k in np.unique(seg["targets"][row][seg["targets"][row] > 0]):
      pair = (_marian_ids(ids[side][row][seg[side][row] == k], pad) for side in sides)
      source, target = (torch.as_tensor(x, dtype=torch.long)[None] for x in pair)  # [1, S_k/T_k]
      with torch.no_grad():  # labels: decoder inputs are the targets shifted after PAD
        logits = model(input_ids=source, labels=target).logits  # [1, T_k, V]
      logp = torch.log_softmax(logits.double(), -1)[0]  # [T_k, V]
      total -= logp.gather(1, target[0, :, None]).sum().item()
      count += target.shape[1]
  return total / count


def test_marian_translation_is_transformers_on_marians_ids(hf_dirs, tmp_path, caplog):
  hf_dir = hf_dirs["marian"]
  metrics, batch, s, kept = _fine_tune(
    "marian", hf_dir, tmp_path, caplog, **{"evaluate.bleu.every": 2}
  )
  copied, total = _copied(caplog)
  assert not kept and copied == total == len(jax.tree.leaves(s.state.params))
  assert 0.0 <= metrics["bleu"] <= 100.0  # greedy decoding to our EOS, at the end

  tok, c = s.info.tokenizer, s.model_cfg
  hf_cfg = json.loads((hf_dir / "config.json").read_text())
  last = hf_cfg["vocab_size"] - 1
  assert c.vocab_size == tok.vocab_size == last + 1
  hf_ids = (hf_cfg["pad_token_id"], hf_cfg["eos_token_id"], hf_cfg["decoder_start_token_id"])
  assert hf_ids == (last, 0, last)  # Marian's PAD, EOS, decoder start
  assert (tok.pad_id, tok.eos_id, c.decoder_start_id) == (0, last, 0)  # ours, swapped

  # The first loss is transformers' own on the batch in Marian's ids (float32 on both
  # sides: the losses agree to a few float32 roundings of values of order 5).
  first = _first_train_loss(tmp_path / "run")
  np.testing.assert_allclose(first, _hf_marian_loss(hf_dir, batch), rtol=1e-5)

  # Packed training rows: each segment ends with EOS V - 1, padding is PAD 0.
  for side in ("inputs", "targets"):
    ids, seg = np.asarray(batch[side]), np.asarray(batch[f"{side}_segment_ids"])
    assert (ids[seg == 0] == 0).all() and (ids[seg > 0] != 0).all()
    ends = np.concatenate([seg[:, 1:] != seg[:, :-1], np.ones_like(seg[:, :1], bool)], 1)
    ends &= seg > 0  # [B, T] last token of each segment
    assert ends.any() and (ids[ends] == last).all() and (ids[~ends & (seg > 0)] != last).all()

  # Evaluation rows are one pair each, as Marian tokenizes (`source.spm` pieces through
  # `vocab.json`, then EOS 0), swapped to our ids and padded with 0.
  sp = spm.SentencePieceProcessor(model_file=str(hf_dir / "source.spm"))
  vocab = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))
  split = sources.open_splits(s.info.config, tmp_path / "fresh", paired=True).eval
  shard = pipeline.records(split, pipeline.Loader())
  rows = next(iter(s.eval_factory()))
  length = rows["inputs"].shape[1]
  for k in range(len(rows["inputs"])):
    _, record = shard[k]
    for side, column in (("inputs", "en"), ("targets", "es")):
      pieces = sp.encode(features.text_of(record, column), out_type=str)
      marian = [vocab.get(p, vocab["<unk>"]) for p in pieces][: length - 1] + [0]
      expected = _marian_ids(np.array(marian), last).tolist() + [0] * (length - len(marian))
      assert rows[side][k].tolist() == expected, (k, side)


def test_vit_classifier_starts_from_the_checkpoint(hf_dirs, tmp_path, caplog):
  _, batch, s, kept = _fine_tune("vit", hf_dirs["vit"], tmp_path, caplog)
  copied, total = _copied(caplog)
  assert not kept and copied == total == len(jax.tree.leaves(s.state.params))  # head too
  hf_cfg, _ = convert.load(hf_dirs["vit"])
  assert batch["image"].shape[1:] == (hf_cfg.image_size, hf_cfg.image_size, 1)  # resized
  assert (s.model_cfg.num_classes, s.model_cfg.max_len) == (10, hf_cfg.max_len)


def test_dinov2_classifier_starts_from_the_resampled_checkpoint(hf_dirs, tmp_path, caplog):
  """The checkpoint's 2 x 2 patch grid (28 px) at the recipe's 42 px (3 x 3): every tensor
  copied, and the first loss is the one of the table resampled as HF does, not of another."""
  _, batch, s, kept = _fine_tune("dinov2", hf_dirs["dinov2"], tmp_path, caplog)
  copied, total = _copied(caplog)
  assert not kept and copied == total == len(jax.tree.leaves(s.state.params))
  hf_cfg, _ = convert.load(hf_dirs["dinov2"])
  assert (hf_cfg.image_size, hf_cfg.patch_size, hf_cfg.max_len) == (28, 14, 5)
  assert batch["image"].shape[1:] == (42, 42, 1)  # resized to the recipe's size
  assert (s.model_cfg.image_size, s.model_cfg.max_len, s.model_cfg.num_classes) == (42, 10, 10)

  # The check above tells tables apart: the run's fresh table, or the resampled patch rows
  # in another order, move the first loss over ten times its 1e-5 tolerance.
  first = _first_train_loss(tmp_path / "run")
  params, _ = _imported_params(hf_dirs["dinov2"], s.state.params, image_size=42)
  table = params["pos_embedding"]  # [1, 1 + 9, D]
  flipped = np.concatenate([table[:, :1], table[:, :0:-1]], axis=1)
  for wrong in (s.state.params["pos_embedding"], flipped):
    loss = _task_loss(s, {**params, "pos_embedding": wrong}, batch)
    assert abs(loss - first) > 1e-4 * first, (loss, first)
