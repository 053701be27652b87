"""Tokenizers: round trips, the shared special-id convention, saving and caching."""

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.data import tokenizers as T

TEXT = (
  "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
  "First Citizen:\nYou are all resolved rather to die than to famish?\n"
) * 20


def test_special_ids_are_the_convention():
  assert (T.PAD_ID, T.BOS_ID, T.EOS_ID, T.UNK_ID, T.MASK_ID, T.CLS_ID, T.SEP_ID) == tuple(range(7))
  for tok in (T.CharTokenizer.train([TEXT]), T.ByteTokenizer()):
    assert (
      tok.pad_id,
      tok.bos_id,
      tok.eos_id,
      tok.unk_id,
      tok.mask_id,
      tok.cls_id,
      tok.sep_id,
    ) == tuple(range(7))
    assert min(tok.encode(TEXT)) >= T.NUM_SPECIAL


def test_char_round_trip_unknown_and_save(tmp_path):
  tok = T.CharTokenizer.train([TEXT])
  assert tok.vocab_size == T.NUM_SPECIAL + len(set(TEXT))
  assert tok.decode(tok.encode(TEXT)) == TEXT
  text = "Speak, zebra! Zürich"
  unknown = [c for c in text if c not in TEXT]
  assert unknown == ["b", "!", "Z", "ü"]
  ids = tok.encode(text)
  assert ids.count(T.UNK_ID) == len(unknown)
  assert tok.unknown_chars(text) == {c: 1 for c in unknown}
  assert tok.decode(ids) == "".join(c if c in TEXT else "\ufffd" for c in text)
  assert tok.decode([T.PAD_ID, T.BOS_ID, *tok.encode("hear"), T.EOS_ID, T.PAD_ID]) == "hear"
  path = tmp_path / "vocab.json"
  tok.save(path)
  assert path.read_text().startswith("{")
  loaded = T.load_tokenizer(path)
  assert isinstance(loaded, T.CharTokenizer) and loaded.chars == tok.chars
  assert loaded.encode(TEXT) == tok.encode(TEXT)


@settings(max_examples=30, deadline=None)
@given(st.text())
def test_byte_round_trips_any_text(text):
  tok = T.ByteTokenizer()
  ids = tok.encode(text)
  assert tok.vocab_size == 263 and all(T.NUM_SPECIAL <= i < 263 for i in ids)
  assert tok.decode(ids) == text


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=sorted(set(TEXT))))
def test_char_round_trips_text_in_vocabulary(text):
  tok = T.CharTokenizer.train([TEXT])
  assert tok.decode(tok.encode(text)) == text


SHAKESPEARE = Path(__file__).resolve().parents[1] / "data" / "tinyshakespeare.txt.gz"


@pytest.fixture(scope="module")
def shakespeare():
  return gzip.decompress(SHAKESPEARE.read_bytes()).decode()[:60_000]


@pytest.fixture(scope="module")
def spm_tok(shakespeare):
  return T.SentencePieceTokenizer.train([shakespeare], vocab_size=300)


def test_sentencepiece_round_trip_and_specials(spm_tok, shakespeare, tmp_path):
  assert spm_tok.vocab_size == 300
  assert [spm_tok.id_to_piece(i) for i in range(7)] == [
    "<pad>",
    "<s>",
    "</s>",
    "<unk>",
    "[MASK]",
    "[CLS]",
    "[SEP]",
  ]
  for text in (shakespeare, TEXT, "  leading and  double  spaces \n\nSpeak!", "hear me\n"):
    assert spm_tok.decode(spm_tok.encode(text)) == text
  assert min(spm_tok.encode(TEXT)) >= T.NUM_SPECIAL
  path = tmp_path / "spm.model"
  spm_tok.save(path)
  loaded = T.load_tokenizer(path)
  assert loaded.encode(TEXT) == spm_tok.encode(TEXT)
  clone = pickle.loads(pickle.dumps(spm_tok))  # grain workers receive tokenizers pickled
  assert clone.encode("Speak, speak.") == spm_tok.encode("Speak, speak.")


def test_sentencepiece_bpe_and_determinism():
  bpe = T.SentencePieceTokenizer.train([TEXT], vocab_size=80, model_type="bpe")
  assert bpe.decode(bpe.encode(TEXT)) == TEXT
  again = T.SentencePieceTokenizer.train([TEXT], vocab_size=80, model_type="bpe")
  assert again.encode(TEXT) == bpe.encode(TEXT)


def test_get_tokenizer_trains_once_then_loads(tmp_path):
  calls = []

  def texts():
    calls.append(1)
    return [TEXT]

  first = T.get_tokenizer("sentencepiece", tmp_path, texts, vocab_size=70)
  second = T.get_tokenizer("sentencepiece", tmp_path, texts, vocab_size=70)
  assert len(calls) == 1 and (tmp_path / "spm_unigram_70.model").exists()
  assert first.encode(TEXT) == second.encode(TEXT)
  char = T.get_tokenizer("char", tmp_path, texts)
  assert (tmp_path / "char_vocab.json").exists() and char.decode(char.encode(TEXT)) == TEXT
  assert T.get_tokenizer("byte", tmp_path, texts).vocab_size == 263
  with pytest.raises(ValueError, match="tokenizer kind"):
    T.get_tokenizer("words", tmp_path, texts)


def test_word_starts():
  char = T.CharTokenizer.train([TEXT])
  text = "hear me  speak"
  starts = char.word_starts(np.array(char.encode(text)))
  assert [text[i] for i in np.flatnonzero(starts)] == ["h", "m", "s"]
  byte = T.ByteTokenizer()
  ids = np.array([T.CLS_ID, *byte.encode("añb c")])
  assert byte.word_starts(ids).tolist() == [False, True, False, False, False, False, True]
  spm = T.SentencePieceTokenizer.train([TEXT], vocab_size=80)
  ids = np.array(spm.encode("hear me speak"))
  starts = spm.word_starts(ids)
  words = [
    "".join(spm.id_to_piece(int(i)) for i in ids[a:b])
    for a, b in zip(np.flatnonzero(starts), [*np.flatnonzero(starts)[1:], len(ids)], strict=True)
  ]
  assert [w.replace("\u2581", "") for w in words] == ["hear", "me", "speak"]


def test_load_rejects_other_conventions(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text('{"kind": "char", "specials": ["<pad>"], "code_points": [97]}')
  with pytest.raises(ValueError, match="special tokens"):
    T.load_tokenizer(bad)
  with pytest.raises(FileNotFoundError, match="missing.json"):
    T.load_tokenizer(tmp_path / "missing.json")
