"""Tokenizers: character, byte and SentencePiece, behind one interface.

Id convention shared by every tokenizer (the models rely on it):

  0 PAD   1 BOS   2 EOS   3 UNK   4 MASK   5 CLS   6 SEP   7.. ordinary tokens

`encode(str) -> list[int]` adds no special tokens; `decode(ids) -> str` drops PAD, BOS,
EOS, MASK, CLS and SEP and renders UNK as U+FFFD (or the SentencePiece ' ⁇ '). Vocabularies
are saved as JSON (char, byte) or a SentencePiece `.model` protobuf; never pickled.
`get_tokenizer` trains on the training text at first use and caches the result. Files
are read and written through `etils.epath`, so a cache may live on object storage
(`gs://...`); SentencePiece models are loaded from their bytes, never from a local path.
"""

from __future__ import annotations

import abc
import collections
import io
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from etils import epath

from transformer.data import progress
from transformer.data.files import write_atomic

PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID, CLS_ID, SEP_ID = range(7)
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>", "[MASK]", "[CLS]", "[SEP]")
NUM_SPECIAL = len(SPECIAL_TOKENS)  # ordinary tokens start here
_SILENT = frozenset({PAD_ID, BOS_ID, EOS_ID, MASK_ID, CLS_ID, SEP_ID})  # dropped by decode


class Tokenizer(abc.ABC):
  """Common interface; `vocab_size` counts the special ids."""

  kind: str
  pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
  mask_id, cls_id, sep_id = MASK_ID, CLS_ID, SEP_ID
  num_special = NUM_SPECIAL

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int: ...

  @abc.abstractmethod
  def encode_array(self, text: str) -> np.ndarray:
    """Token ids of `text` as int32 [L] (no special tokens added)."""

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str: ...

  @abc.abstractmethod
  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    """bool [L]: True where a token begins a whitespace-delimited word (for WWM)."""

  @abc.abstractmethod
  def save(self, path: str | os.PathLike) -> None: ...

  def encode(self, text: str) -> list[int]:
    return self.encode_array(text).tolist()


def _space_word_starts(ids: np.ndarray, is_space: np.ndarray) -> np.ndarray:
  """Word starts for char / byte ids: a non-space token after a space or a special."""
  ids = np.asarray(ids)
  ordinary = ids >= NUM_SPECIAL
  space = np.zeros(ids.shape, bool)
  space[ordinary] = is_space[ids[ordinary] - NUM_SPECIAL]
  prev_breaks = np.concatenate([[True], space[:-1] | ~ordinary[:-1]])
  return ordinary & ~space & prev_breaks


class CharTokenizer(Tokenizer):
  """One id per Unicode character seen in the training text; others map to UNK."""

  kind = "char"

  def __init__(self, chars: Sequence[str]):
    codes = sorted({ord(c) for c in chars})
    self._codes = np.array(codes, np.uint32)  # [V - NUM_SPECIAL], sorted code points
    self._is_space = np.array([chr(c).isspace() for c in codes], bool)

  @classmethod
  def train(cls, texts: Iterable[str]) -> CharTokenizer:
    seen: set[str] = set()
    for t in texts:
      seen.update(t)
    if not seen:
      raise ValueError("cannot build a character vocabulary from empty text")
    return cls(sorted(seen))

  @property
  def vocab_size(self) -> int:
    return NUM_SPECIAL + len(self._codes)

  @property
  def chars(self) -> str:
    return "".join(map(chr, self._codes))

  def _lookup(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    cps = np.frombuffer(text.encode("utf-32-le"), "<u4")  # [L] code points
    pos = np.searchsorted(self._codes, cps).clip(max=len(self._codes) - 1)
    return pos, self._codes[pos] == cps

  def encode_array(self, text: str) -> np.ndarray:
    pos, known = self._lookup(text)
    return np.where(known, pos + NUM_SPECIAL, UNK_ID).astype(np.int32)

  def unknown_chars(self, text: str) -> collections.Counter[str]:
    """The characters of `text` outside the vocabulary, with their counts."""
    _, known = self._lookup(text)
    return collections.Counter(text[i] for i in np.flatnonzero(~known))

  def decode(self, ids: Iterable[int]) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i >= NUM_SPECIAL:
        out.append(chr(self._codes[i - NUM_SPECIAL]))
      elif i == UNK_ID:
        out.append("\ufffd")
    return "".join(out)

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    return _space_word_starts(ids, self._is_space)

  def save(self, path: str | os.PathLike) -> None:
    data = {"kind": self.kind, "specials": SPECIAL_TOKENS, "code_points": self._codes.tolist()}
    write_atomic(path, json.dumps(data).encode())


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes: byte b has id b + NUM_SPECIAL; vocab_size = 263. No UNK ever."""

  kind = "byte"
  _is_space = np.array([chr(b).isspace() if b < 128 else False for b in range(256)], bool)

  @property
  def vocab_size(self) -> int:
    return NUM_SPECIAL + 256

  def encode_array(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + NUM_SPECIAL

  def decode(self, ids: Iterable[int]) -> str:
    data = bytes(int(i) - NUM_SPECIAL for i in ids if int(i) >= NUM_SPECIAL)
    return data.decode("utf-8", errors="replace")

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids)
    continuation = (ids >= NUM_SPECIAL + 0x80) & (ids < NUM_SPECIAL + 0xC0)  # UTF-8 10xxxxxx
    return _space_word_starts(ids, self._is_space) & ~continuation

  def save(self, path: str | os.PathLike) -> None:
    write_atomic(path, json.dumps({"kind": self.kind, "specials": SPECIAL_TOKENS}).encode())


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model trained with the shared special ids (pad 0 ... sep 6)."""

  kind = "sentencepiece"

  def __init__(self, model_proto: bytes):
    import sentencepiece as spm

    self._proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    pieces = [self._sp.id_to_piece(i) for i in range(NUM_SPECIAL)]
    if pieces != ["<pad>", "<s>", "</s>", "<unk>", "[MASK]", "[CLS]", "[SEP]"]:
      raise ValueError(f"SentencePiece model does not follow the id convention: {pieces}")
    self._starts = np.array(
      [self._sp.id_to_piece(i).startswith("\u2581") for i in range(self.vocab_size)], bool
    )
    newline = self._sp.piece_to_id("\n")
    self._newline_id = -1 if newline == UNK_ID else newline

  def __getstate__(self) -> dict:  # Picklable for grain workers: the proto rebuilds it.
    return {"model_proto": self._proto}

  def __setstate__(self, state: dict) -> None:
    self.__init__(state["model_proto"])

  @classmethod
  def train(
    cls,
    texts: Iterable[str],
    vocab_size: int,
    model_type: str = "unigram",
    byte_fallback: bool | None = None,
    num_threads: int = 1,
  ) -> SentencePieceTokenizer:
    """Trains on `texts` (split into lines); identity normalisation keeps text exact.

    `byte_fallback` (default: on when vocab_size >= 1024) spells unseen characters
    as bytes instead of UNK. One thread (the default) makes training deterministic.
    """
    import sentencepiece as spm

    if model_type not in ("unigram", "bpe"):
      raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
    lines = (line for t in texts for line in t.split("\n") if line.strip())
    model = io.BytesIO()
    desc = f"training the SentencePiece tokenizer ({model_type}, vocab {vocab_size})"
    with progress.Timed(desc):  # one native call: its start and its duration
      spm.SentencePieceTrainer.train(
        sentence_iterator=lines,
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        user_defined_symbols=[*SPECIAL_TOKENS[MASK_ID:], "\n"],
        character_coverage=1.0,
        byte_fallback=vocab_size >= 1024 if byte_fallback is None else byte_fallback,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        hard_vocab_limit=False,
        num_threads=num_threads,
        minloglevel=2,
      )
    tok = cls(model.getvalue())
    if tok.vocab_size < vocab_size:
      logging.warning(
        "SentencePiece: the text supports %d pieces, not %d", tok.vocab_size, vocab_size
      )
    return tok

  @property
  def vocab_size(self) -> int:
    return self._sp.vocab_size()

  def encode_array(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text), np.int32)

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.decode([int(i) for i in ids if int(i) not in _SILENT])

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(i)

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids)
    breaks = (ids < NUM_SPECIAL) | (ids == self._newline_id)
    prev_breaks = np.concatenate([[True], breaks[:-1]])
    return ~breaks & (self._starts[ids] | prev_breaks)

  def save(self, path: str | os.PathLike) -> None:
    write_atomic(path, self._proto)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """Loads a tokenizer saved by `save` (`.json` for char / byte, else SentencePiece); a
  local path or an object-storage URL."""
  p = epath.Path(path)
  if not p.exists():
    raise FileNotFoundError(f"{p}: no such tokenizer file")
  if p.suffix != ".json":
    proto = p.read_bytes()
    if not proto:
      raise ValueError(f"{p}: empty file, expected a SentencePiece model")
    try:
      return SentencePieceTokenizer(proto)
    except (RuntimeError, ValueError, OSError) as e:  # sentencepiece: RuntimeError on garbage
      raise ValueError(f"{p}: not a usable SentencePiece model: {e}") from None
  try:
    data = json.loads(p.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{p}: not a tokenizer JSON file: {e}") from None
  if not isinstance(data, dict):
    raise ValueError(f"{p}: expected a JSON object, got {type(data).__name__}")
  if data.get("kind") in LOADERS:
    return LOADERS[data["kind"]](data, p)
  if tuple(data.get("specials", ())) != SPECIAL_TOKENS:
    raise ValueError(f"{p}: special tokens {data.get('specials')} differ from {SPECIAL_TOKENS}")
  kind = data.get("kind")
  if kind == "char":
    codes = data.get("code_points")
    if not isinstance(codes, list) or not all(
      isinstance(c, int) and 0 <= c <= 0x10FFFF for c in codes
    ):
      raise ValueError(f"{p}: 'code_points' must be a list of Unicode code points")
    return CharTokenizer([chr(c) for c in codes])
  if kind == "byte":
    return ByteTokenizer()
  raise ValueError(f"{p}: unknown tokenizer kind {kind!r}")


# kind -> (parsed JSON, path) -> tokenizer, for kinds saved by packages above this one
# (transformer.convert.tokenizers registers 'pretrained' when imported)
LOADERS: dict[str, Callable[[dict, epath.Path], Tokenizer]] = {}


def tokenizer_filename(kind: str, vocab_size: int = 0, model_type: str = "unigram") -> str:
  if kind not in _TRAINERS:
    raise ValueError(f"tokenizer kind must be one of {sorted(_TRAINERS)}, got {kind!r}")
  return f"spm_{model_type}_{vocab_size}.model" if kind == "sentencepiece" else f"{kind}_vocab.json"


def get_tokenizer(
  kind: str,
  cache_dir: str | os.PathLike,
  training_texts: Callable[[], Iterable[str]],
  vocab_size: int = 8000,
  model_type: str = "unigram",
) -> Tokenizer:
  """Loads `<cache_dir>/<tokenizer_filename>` or trains it on `training_texts()` and saves it.

  `training_texts` is only called when training is needed. For translation, pass the
  source and target training texts together: one shared vocabulary.
  """
  path = epath.Path(cache_dir) / tokenizer_filename(kind, vocab_size, model_type)
  if path.exists():
    return load_tokenizer(path)
  tok = _TRAINERS[kind](training_texts, vocab_size, model_type)
  tok.save(path)
  logging.info("trained %s tokenizer (vocab %d) -> %s", kind, tok.vocab_size, path)
  return tok


# kind -> (training texts, vocab_size, model_type) -> a trained tokenizer
_TRAINERS: dict[str, Callable[[Callable[[], Iterable[str]], int, str], Tokenizer]] = {
  "byte": lambda texts, vocab_size, model_type: ByteTokenizer(),
  "char": lambda texts, vocab_size, model_type: CharTokenizer.train(texts()),
  "sentencepiece": lambda texts, vocab_size, model_type: SentencePieceTokenizer.train(
    texts(), vocab_size, model_type
  ),
  "pretrained": lambda texts, vocab_size, model_type: _untrainable(),
}


def _untrainable() -> Tokenizer:
  raise ValueError(
    "DataConfig.tokenizer='pretrained' is never trained: set data.tokenizer_from to a "
    "workdir holding tokenizers/pretrained_vocab.json (transformer.convert.tokenizers)"
  )
