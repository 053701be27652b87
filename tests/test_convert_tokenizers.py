"""Tokenizers of Hugging Face model directories (`transformer.convert.tokenizers`).

Each directory is built here: a GPT-2-style byte-level BPE and a BERT WordPiece trained
with the `tokenizers` library and saved by `transformers`' tokenizer classes, and a
SentencePiece unigram model (as T5's `spiece.model`, and the same pieces as a `tokenizers`
Unigram in `tokenizer.json`, the way a T5 directory holds both), and a Marian directory as
Opus-MT ships it (`source.spm`, `target.spm`, `vocab.json`; scripts/make_tiny_hf.py). Ids
are compared with the source library's own encoding (Marian: transformers'
`MarianTokenizer`).
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import sentencepiece as spm
from conftest import byte_level_bpe
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transformer import tasks
from transformer.convert import tokenizers as pretrained
from transformer.data import features, sources
from transformer.data.config import DataConfig
from transformer.data.tokenizers import NUM_SPECIAL, load_tokenizer
from transformer.evaluators.base import strip_ids
from transformer.nn.config import ModelConfig
from transformer.train import finetune

CORPUS = [
  "The quick brown fox jumps over the lazy dog.",
  "Hello world, this is a test of the tokenizer!",
  "Pretrained ids stay as they are: the embedding rows are the checkpoint's.",
  "Sentences for a tiny vocabulary, trained in a test.",
] * 4
SAMPLES = [
  "Hello world, the quick fox!",
  "Pretrained rows are the checkpoint's embedding.",
  "a test of the vocabulary",
]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
  from transformers import GPT2TokenizerFast

  tok = byte_level_bpe(CORPUS, ["<|endoftext|>"])  # the last id, as GPT-2's 50256
  path = tmp_path_factory.mktemp("gpt2")
  end = "<|endoftext|>"
  GPT2TokenizerFast(
    tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end
  ).save_pretrained(path)
  return path, tok


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
  from transformers import BertTokenizerFast

  tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  specials = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # BERT's order
  trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials, show_progress=False)
  tok.train_from_iterator(CORPUS, trainer)
  path = tmp_path_factory.mktemp("bert")
  roles = {f"{r}_token": f"[{r.upper()}]" for r in ("pad", "unk", "cls", "sep", "mask")}
  BertTokenizerFast(tokenizer_object=tok, **roles).save_pretrained(path)
  return path, tok


def _spm_model(vocab_size: int, model_type: str, **special_ids: int) -> bytes:
  """A SentencePiece model trained on CORPUS with these special ids (-1: none)."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(CORPUS),
    model_writer=model,
    vocab_size=vocab_size,
    model_type=model_type,
    hard_vocab_limit=False,
    num_threads=1,
    minloglevel=2,
    **special_ids,
  )
  return model.getvalue()


@pytest.fixture(scope="module")
def t5_dirs(tmp_path_factory):
  """(spiece.model only, tokenizer.json + tokenizer_config.json, the SentencePiece model)."""
  model = _spm_model(80, "unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)  # T5: no BOS
  sp = spm.SentencePieceProcessor(model_proto=model)
  spiece = tmp_path_factory.mktemp("t5_spiece")
  (spiece / "spiece.model").write_bytes(model)
  # The same pieces as a `tokenizers` Unigram, sentinels added from <extra_id_99> down to
  # <extra_id_0>, so <extra_id_k> = pieces + 99 - k as in T5.
  n = sp.get_piece_size()
  vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(n)]
  tok = Tokenizer(models.Unigram(vocab, unk_id=2))
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
  tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
  tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
  tok.add_special_tokens([f"<extra_id_{k}>" for k in reversed(range(100))])
  fast = tmp_path_factory.mktemp("t5_fast")
  tok.save(str(fast / "tokenizer.json"))
  config = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "extra_ids": 100}
  (fast / "tokenizer_config.json").write_text(json.dumps(config))
  return spiece, fast, sp, tok


def test_byte_level_bpe_matches_the_library(gpt2_dir):
  path, ref = gpt2_dir
  tok = pretrained.from_pretrained_dir(path)
  end = ref.token_to_id("<|endoftext|>")
  assert end == ref.get_vocab_size() - 1 and end >= NUM_SPECIAL
  assert tok.vocab_size == ref.get_vocab_size()
  for text in SAMPLES:
    ids = tok.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False).ids
    assert tok.encode_array(text).dtype == np.int32 and tok.encode_array(text).tolist() == ids
    assert tok.decode(ids) == text  # byte-level: exact round trip
  assert tok.bos_id == tok.eos_id == tok.unk_id == end
  assert tok.present_specials() == {"bos": end, "eos": end, "unk": end}
  assert tok.decode([end, *tok.encode("Hello"), end]) == "Hello"  # specials are dropped
  for role in ("pad_id", "cls_id", "sep_id", "mask_id"):
    with pytest.raises(ValueError, match=f"has no {role[:-3].upper()} token"):
      getattr(tok, role)


def test_wordpiece_matches_the_library(bert_dir):
  path, ref = bert_dir
  tok = pretrained.from_pretrained_dir(path)
  for text in SAMPLES:
    ids = tok.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)
  assert tok.decode(tok.encode("A Test of the vocabulary")) == "a test of the vocabulary"
  expected = {"pad": 0, "unk": 2, "cls": 3, "sep": 4, "mask": 5}
  assert tok.present_specials() == expected
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 2, 3, 4, 5)
  with pytest.raises(ValueError, match="has no BOS token"):
    _ = tok.bos_id
  ids = np.array([3, *tok.encode("Hello world, quick"), 4])
  pieces = [tok.id_to_piece(i) for i in ids]
  starts = tok.word_starts(ids)
  assert starts.tolist() == [p not in ("[CLS]", "[SEP]") and not p.startswith("##") for p in pieces]


def test_sentencepiece_unigram_matches_the_libraries(t5_dirs):
  spiece, fast, sp, ref = t5_dirs
  from_model = pretrained.from_pretrained_dir(spiece)
  from_json = pretrained.from_pretrained_dir(fast)
  n = sp.get_piece_size()
  for tok in (from_model, from_json):
    assert tok.vocab_size == n + 100
    assert tok.present_specials() == {"pad": 0, "eos": 1, "unk": 2}  # T5: no BOS
    assert [tok.sentinel_id(k) for k in (0, 1, 99)] == [n + 99, n + 98, n]
    with pytest.raises(ValueError, match="100 sentinels, no 100"):
      tok.sentinel_id(100)
  for text in SAMPLES:
    ids = from_model.encode(text)
    assert ids == sp.encode(text) == ref.encode(text, add_special_tokens=False).ids
    assert from_json.encode(text) == ids
    assert from_model.decode(ids) == from_json.decode(ids) == text
  sentinel = from_model.sentinel_id(0)
  assert from_model.id_to_piece(sentinel) == from_json.id_to_piece(sentinel) == "<extra_id_0>"
  with_specials = [*from_model.encode("a test"), sentinel, 1, 0]
  assert from_model.decode(with_specials) == from_json.decode(with_specials) == "a test"


def test_llama_style_tokenizer_model_reports_its_own_ids(tmp_path):
  model = _spm_model(70, "bpe", unk_id=0, bos_id=1, eos_id=2, pad_id=-1)  # Llama: no PAD
  (tmp_path / "tokenizer.model").write_bytes(model)
  tok = pretrained.from_pretrained_dir(tmp_path)
  sp = spm.SentencePieceProcessor(model_proto=model)
  assert tok.vocab_size == sp.get_piece_size() and tok.sentinels == ()
  assert tok.present_specials() == {"unk": 0, "bos": 1, "eos": 2}
  assert all(tok.encode(t) == sp.encode(t) and tok.decode(sp.encode(t)) == t for t in SAMPLES)


def test_pipelines_use_the_pretrained_ids(gpt2_dir, bert_dir, t5_dirs):
  gpt2 = pretrained.from_pretrained_dir(gpt2_dir[0])
  bert = pretrained.from_pretrained_dir(bert_dir[0])
  t5 = pretrained.from_pretrained_dir(t5_dirs[1])
  record = {"text": b"Hello world", "label": 1, "en": b"a test", "es": b"the fox"}
  body = gpt2.encode("Hello world")
  lm = features.LMExample(gpt2, seq_len=16)((0, record))
  assert lm["inputs"].tolist() == [gpt2.bos_id, *body]
  assert lm["targets"].tolist() == [*body, gpt2.eos_id]
  row = features.Classification(bert, seq_len=8)((0, record))
  n = len(bert.encode("Hello world"))
  assert row["inputs"].tolist()[: n + 1] == [bert.cls_id, *bert.encode("Hello world")]
  assert row["segment_ids"].tolist() == [1] * (n + 1) + [0] * (7 - n)  # padding is masked
  pair = features.Translation(t5, 16, 16, "en", "es")((0, record))
  assert pair["inputs"].tolist() == [*t5.encode("a test"), 1]  # T5's EOS
  assert pair["targets"].tolist() == [*t5.encode("the fox"), 1]
  # Paths that cannot honour pretrained ids refuse in one line.
  with pytest.raises(ValueError, match="has no PAD token"):
    features.Translation(gpt2, 16, 16, "en", "es")
  with pytest.raises(ValueError, match="masked-LM corruption and span-corruption sentinels"):
    features.Mask(bert)
  with pytest.raises(ValueError, match="has no BOS token"):
    features.LMExample(bert, seq_len=16)((0, record))
  # Decoding stops at the tokenizer's EOS and keeps ids the project's PAD would drop.
  assert strip_ids(np.array([5, 0, 7, gpt2.eos_id, 0, 0]), gpt2.eos_id, pad_id=None) == [5, 0, 7]
  assert strip_ids(np.array([5, 7, 1, 0, 0]), t5.eos_id) == [5, 7]


def test_config_refuses_what_is_not_supported(tmp_path):
  with pytest.raises(ValueError, match="tokenizer 'pretrained' needs tokenizer_from"):
    DataConfig(tokenizer="pretrained")
  data = DataConfig(kind="mlm", tokenizer="pretrained", tokenizer_from=str(tmp_path))
  model = ModelConfig(family="encoder", vocab_size=100, d_model=16, num_heads=2, num_layers=1)
  with pytest.raises(ValueError, match="data.tokenizer='pretrained': masked-LM"):
    tasks.create(data, 16).check(model, data)


def test_saved_tokenizer_reloads_from_a_workdir_cache(tmp_path, gpt2_dir, t5_dirs):
  for source in (gpt2_dir[0], t5_dirs[0], t5_dirs[1]):
    tok = pretrained.from_pretrained_dir(source)
    converted = tmp_path / f"converted_{source.name}"
    saved = pretrained.save_to_workdir(tok, converted)
    assert saved == converted / "tokenizers" / "pretrained_vocab.json"
    cfg = DataConfig(tokenizer="pretrained", tokenizer_from=str(converted))
    splits = sources.Splits(train=[], eval=[], name="data.txt", key="local_text_corpus-data_1")
    run = tmp_path / f"run_{source.name}"
    for _ in range(2):  # copied into the run's cache, then found there (resume, eval)
      again = sources.tokenizer_for(cfg, splits, run)
      assert type(again) is pretrained.PretrainedTokenizer
      assert again.specials == tok.specials and again.sentinels == tok.sentinels
      assert all(again.encode(t) == tok.encode(t) for t in SAMPLES)
    cached = run / "tokenizers" / "local_text_corpus-data_1" / "pretrained_vocab.json"
    assert cached.read_bytes() == saved.read_bytes()
    assert load_tokenizer(cached).decode(tok.encode(SAMPLES[0])) == tok.decode(
      tok.encode(SAMPLES[0])
    )
    clone = pickle.loads(pickle.dumps(again))  # grain workers
    assert clone.encode(SAMPLES[1]) == tok.encode(SAMPLES[1])
    # Fine-tuning from the converted workdir: the same tokenizer, byte for byte.
    finetune.check_init_tokenizer(str(converted), SimpleNamespace(tokenizer=again, config=cfg))
  other = SimpleNamespace(tokenizer=pretrained.from_pretrained_dir(gpt2_dir[0]), config=cfg)
  with pytest.raises(ValueError, match="differs from this run's"):
    finetune.check_init_tokenizer(str(converted), other)  # converted: the last (T5) one


def test_bad_directories_fail_in_one_line(tmp_path):
  with pytest.raises(FileNotFoundError, match="no tokenizer file"):
    pretrained.from_pretrained_dir(tmp_path)
  (tmp_path / "tokenizer.json").write_text("{}")
  with pytest.raises(ValueError, match="not a usable tokenizer.json"):
    pretrained.from_pretrained_dir(tmp_path)
  (tmp_path / "tokenizer.json").unlink()
  (tmp_path / "spiece.model").write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a usable SentencePiece model"):
    pretrained.from_pretrained_dir(tmp_path)
  (tmp_path / "broken.json").write_text(json.dumps({"kind": "pretrained", "format": 1}))
  with pytest.raises(ValueError, match="incomplete saved pretrained tokenizer"):
    load_tokenizer(tmp_path / "broken.json")


MARIAN_TEXTS = [
  "",
  "  Leading, trailing   and repeated  spaces  ",
  "Tab\tand\nnewline",
  "Ünïcödé “quotes” — dashes… and ñ, ç, ß",
  "Full-width ＡＢＣ １２３ and ligatures ﬁ ﬂ",
  "漢字 and emoji 🙂 are not in the vocabulary",
  ">>es<< a language code first",
  ">>es<<no space, >>fr<< twice",
  "UPPER lower MiXeD 12345 3.14",
]


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
  """A Marian directory as Opus-MT ships it (source.spm = target.spm, vocab.json, no
  tokenizer.json), with the config.json whose PAD (V - 1) the import swaps with 0."""
  from test_recipes import make_tiny_hf

  script = make_tiny_hf()
  path = tmp_path_factory.mktemp("marian")
  texts = script.verses(100)
  vocab = script.marian_tokenizer(path, texts)
  (path / "tokenizer.json").unlink()
  architecture, fields = script.hf_config("marian", vocab)
  (path / "config.json").write_text(json.dumps({"architectures": [architecture], **fields}))
  return path, texts, vocab


def test_marian_vocabulary_matches_marian_tokenizer(marian_dir, tmp_path):
  from transformers import MarianTokenizer

  path, verses, v = marian_dir
  with warnings.catch_warnings():  # its optional punctuation normaliser, which encode skips
    warnings.simplefilter("ignore", UserWarning)
    ref = MarianTokenizer(
      str(path / "source.spm"), str(path / "target.spm"), str(path / "vocab.json"),
      source_lang="en", target_lang="es",
    )  # fmt: skip
  tok = pretrained.from_pretrained_dir(path)
  assert tok.vocab_size == ref.vocab_size == v
  # Marian's EOS 0 and PAD V - 1 trade places; UNK 1 stays.
  assert (ref.eos_token_id, ref.unk_token_id, ref.pad_token_id) == (0, 1, v - 1)
  assert tok.present_specials() == {"pad": 0, "eos": v - 1, "unk": 1}
  swap = np.arange(v)
  swap[[0, v - 1]] = [v - 1, 0]
  texts = [*verses[:16], *verses[-16:], *MARIAN_TEXTS]  # English and Spanish verses
  unknown = 0
  for text in texts:
    ids = ref(text)["input_ids"]
    assert ids[-1] == ref.eos_token_id  # MarianTokenizer appends EOS; the pipelines do here
    ours = tok.encode(text)
    assert ours == swap[ids[:-1]].tolist(), text
    assert tok.decode([*ours, tok.eos_id, tok.pad_id]) == ref.decode(ids, skip_special_tokens=True)
    unknown += ours.count(tok.unk_id)
  assert unknown > 0  # pieces missing from vocab.json are UNK, as in MarianTokenizer
  assert tok.decode(tok.encode(verses[0])) == verses[0]
  assert tok.id_to_piece(0) == "<pad>" and tok.id_to_piece(v - 1) == "</s>"
  # The saved tokenizer reloads (and pickles) with the same ids.
  pretrained.save_to_workdir(tok, tmp_path)
  again = load_tokenizer(tmp_path / "tokenizers" / pretrained.filename())
  clone = pickle.loads(pickle.dumps(again))
  assert all(again.encode(t) == clone.encode(t) == tok.encode(t) for t in texts)
  assert again.present_specials() == tok.present_specials()
  pair = features.Translation(tok, 64, 64, "en", "es")((0, {"en": b"a test", "es": b"hola"}))
  assert pair["inputs"].tolist() == [*swap[ref("a test")["input_ids"]]]  # EOS V - 1


def test_marian_with_another_target_model_is_refused(marian_dir, tmp_path):
  path, _, _ = marian_dir
  for name in ("source.spm", "vocab.json", "tokenizer_config.json", "config.json"):
    (tmp_path / name).write_bytes((path / name).read_bytes())
  (tmp_path / "target.spm").write_bytes(_spm_model(60, "unigram"))
  with pytest.raises(ValueError, match="target.spm differs from source.spm") as e:
    pretrained.from_pretrained_dir(tmp_path)
  assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)
  assert "same model, or a tokenizer.json" in str(e.value)
  (tmp_path / "target.spm").write_bytes((path / "source.spm").read_bytes())
  assert pretrained.from_pretrained_dir(tmp_path).encode("a test")  # the same model loads
  (tmp_path / "vocab.json").unlink()
  with pytest.raises(FileNotFoundError, match="source.spm without vocab.json"):
    pretrained.from_pretrained_dir(tmp_path)
