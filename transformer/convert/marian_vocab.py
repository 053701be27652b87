"""A Marian (Opus-MT) vocabulary as `convert.tokenizers` reads it when the directory has no
`tokenizer.json`: `source.spm` (a SentencePiece model) segments the text and `vocab.json`
numbers the pieces, as transformers' `MarianTokenizer` encodes the source side.

A piece missing from `vocab.json` is the UNK id; a leading language code (`>>es<<`, as
multilingual Opus-MT models take) is one piece. Decoding maps the ids back to pieces
through `vocab.json`, drops the special ids and joins the pieces with SentencePiece.

One tokenizer segments both sides of a translation pair, so a directory whose
`target.spm` differs from its `source.spm`, or whose targets have their own vocabulary
(`separate_vocabs`, `target_vocab.json`), is refused in one line rather than loaded
approximately; a `tokenizer.json` of the vocabulary is read instead where it exists.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from etils import epath

SOURCE, TARGET, VOCAB = "source.spm", "target.spm", "vocab.json"
DEFAULT_TOKENS = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}  # MarianTokenizer's defaults
_MARKER = "\u2581"  # SentencePiece's word-start marker


class MarianVocab:
  """`source.spm` pieces numbered by `vocab.json`; `specials` (role -> id, None: absent)
  gives the UNK id and the ids `decode` drops (None: only `id_of` and `piece` are used)."""

  wordpiece_prefix = None

  def __init__(
    self,
    proto: bytes,
    vocab: Mapping[str, int],
    specials: Mapping[str, int | None] | None = None,
    name: str = "",
  ):
    import sentencepiece as spm

    self.sp = spm.SentencePieceProcessor(model_proto=proto)
    self.ids = {str(piece): int(i) for piece, i in vocab.items()}
    self.pieces = {i: piece for piece, i in self.ids.items()}
    self.vocab_size = len(self.ids)
    self.unk: int | None = None
    self.skip: set[int] = set()
    if specials is not None:
      self.unk = specials.get("unk")
      if self.unk is None:
        raise ValueError(f"{name}: a Marian vocabulary needs an UNK token, and this has none")
      self.skip = {i for i in specials.values() if i is not None}

  @classmethod
  def from_saved(cls, saved: Mapping[str, Any]) -> MarianVocab:
    proto = base64.b64decode(saved["model_proto"])
    return cls(proto, saved["vocab"], saved["specials"], str(saved["name"]))

  def encode(self, text: str) -> list[int]:
    code = []
    if text.startswith(">>") and (end := text.find("<<")) != -1:
      code, text = [text[: end + 2]], text[end + 2 :]
    pieces = code + self.sp.encode(text, out_type=str)
    return [self.ids.get(piece, self.unk) for piece in pieces]  # type: ignore[misc]

  def decode(self, ids: list[int]) -> str:
    pieces = [self.pieces[i] for i in ids if i not in self.skip and i in self.pieces]
    return self.sp.decode_pieces(pieces).replace(_MARKER, " ").strip()

  def id_of(self, piece: str) -> int | None:
    return self.ids.get(piece)

  def piece(self, i: int) -> str:
    return self.pieces.get(i, "")

  def own_specials(self) -> dict[str, int]:
    """MarianTokenizer's default special tokens that the vocabulary has."""
    return {r: self.ids[t] for r, t in DEFAULT_TOKENS.items() if t in self.ids}


def read(root: epath.Path, config: Mapping[str, Any]) -> tuple[dict[str, Any], MarianVocab]:
  """(the saved tokenizer's fields, a `MarianVocab` for looking up the special tokens) of
  the Marian directory `root` (`config`: its tokenizer_config.json)."""
  proto = (root / SOURCE).read_bytes()
  supported = (
    f"supported: a directory whose {SOURCE} and {TARGET} are the same model, or a tokenizer.json"
  )
  target = root / TARGET
  if target.exists() and target.read_bytes() != proto:
    raise ValueError(
      f"{root}: {TARGET} differs from {SOURCE}, and one tokenizer segments both sides of a "
      f"translation pair here; {supported}"
    )
  if config.get("separate_vocabs") or (root / "target_vocab.json").exists():
    raise ValueError(
      f"{root}: the targets have their own vocabulary (separate_vocabs, target_vocab.json), "
      f"and one tokenizer numbers both sides of a translation pair here; {supported}"
    )
  file = root / VOCAB
  if not file.exists():
    raise FileNotFoundError(f"{root}: {SOURCE} without {VOCAB} (the ids of its pieces)")
  try:
    vocab = json.loads(file.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise ValueError(f"{file}: not a JSON file: {e}") from None
  ok = isinstance(vocab, dict) and all(isinstance(i, int) for i in vocab.values())
  if not ok or sorted(vocab.values()) != list(range(len(vocab))):
    raise ValueError(f"{file}: expected a JSON object of pieces to the ids 0 ... N - 1")
  try:
    backend = MarianVocab(proto, vocab)
  except (RuntimeError, OSError) as e:  # sentencepiece: RuntimeError on garbage
    raise ValueError(f"{root / SOURCE}: not a usable SentencePiece model: {e}") from None
  fields = {"model_proto": base64.b64encode(proto).decode("ascii"), "vocab": vocab}
  return fields, backend
