"""The tokenizer of a Hugging Face model directory as a project `Tokenizer`.

`from_pretrained_dir(path)` reads, in this order of preference:

  tokenizer.json            through the `tokenizers` library (byte-level BPE, WordPiece,
                            Unigram, ...: whatever the file describes)
  spiece.model              a SentencePiece model (T5: 100 sentinels above its pieces)
  tokenizer.model           a SentencePiece model (Llama)
  source.spm + vocab.json   Marian (Opus-MT): SentencePiece pieces numbered by vocab.json,
                            as `MarianTokenizer` encodes the source side (`marian_vocab`;
                            a target.spm that differs from source.spm is refused)

Pretrained ids stay as they are: the embedding rows are the checkpoint's, so the project's
special-id constants (0 PAD ... 6 SEP) do not apply. The tokenizer reports the ids of its
own special tokens instead (`pad_id`, `bos_id`, `eos_id`, `unk_id`, `mask_id`, `cls_id`,
`sep_id`, and `sentinel_id(k)` for T5's `<extra_id_k>`). Their roles come from
`tokenizer_config.json` / `special_tokens_map.json` (`bos_token`, `eos_token`, ...), else,
for SentencePiece, from the model's own pad / bos / eos / unk ids. A role the vocabulary
lacks (GPT-2 has no PAD, CLS, SEP or MASK; BERT no BOS or EOS) raises a one-line
ValueError naming it when a pipeline asks for it, and `specials` lists what exists.
`num_special` raises too: ordinary tokens do not start above one block of special ids,
so the paths that assume that block (masked-LM corruption, span-corruption sentinels) are
refused rather than fed wrong ids.

Swapped ids: where the directory's config.json names an architecture whose converter
swaps the checkpoint's PAD id with id 0 (`Converter.swapped_pad`: BART's PAD 1, Marian's
V - 1, so that our PAD is 0), the tokenizer swaps the same two ids, in `encode`, `decode`,
the pieces and the special ids, and reports the model's ids (BART: PAD 0, BOS 1, EOS 2;
Marian: PAD 0, EOS V - 1).

`encode` adds no special tokens (the pipelines add them); `decode` drops them, as the
source library does with `skip_special_tokens=True`. `save` writes one JSON file (kind
'pretrained': the source files' contents, the special ids) that `load_tokenizer` reads back
once this module is imported; `save_to_workdir` puts it where `data.tokenizer='pretrained'`
with `data.tokenizer_from=WORKDIR` finds it. Chat templates: `convert/chat.py`.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np
from etils import epath

from transformer.convert import chat, marian_vocab, registry
from transformer.data import tokenizers as project_tokenizers
from transformer.data.files import write_atomic
from transformer.data.tokenizers import Tokenizer

KIND = "pretrained"
FORMAT = 1  # version of the saved JSON
ROLES = ("pad", "bos", "eos", "unk", "mask", "cls", "sep")
SOURCE_FILES = ("tokenizer.json", "spiece.model", "tokenizer.model", marian_vocab.SOURCE)
T5_EXTRA_IDS = 100  # sentinels T5 places above its SentencePiece pieces
_CONFIG_FILES = ("special_tokens_map.json", "tokenizer_config.json")  # later files win
_WORD_MARKERS = ("\u0120", "\u2581")  # 'Ġ' (byte-level BPE), '▁' (SentencePiece, Metaspace)


def _token_text(value: Any) -> str | None:
  """A special token as `tokenizer_config.json` writes it: a string or an AddedToken dict."""
  if isinstance(value, str):
    return value
  if isinstance(value, Mapping) and isinstance(value.get("content"), str):
    return value["content"]
  return None


def _role_tokens(root: epath.Path) -> tuple[dict[str, str], dict[str, Any]]:
  """(role -> token text, tokenizer_config.json) from the directory's config files."""
  tokens: dict[str, str] = {}
  config: dict[str, Any] = {}
  for name in _CONFIG_FILES:
    f = root / name
    if not f.exists():
      continue
    try:
      data = json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
      raise ValueError(f"{f}: not a JSON file: {e}") from None
    if not isinstance(data, dict):
      raise ValueError(f"{f}: expected a JSON object, got {type(data).__name__}")
    if name == "tokenizer_config.json":
      config = data
    for role in ROLES:
      text = _token_text(data.get(f"{role}_token"))
      if text is not None:
        tokens[role] = text
  return tokens, config


class _Backend(Protocol):
  """What the two source libraries share: ids <-> pieces, encode, decode."""

  vocab_size: int
  wordpiece_prefix: str | None  # WordPiece's continuation prefix ('##'); None: word markers

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: list[int]) -> str: ...

  def id_of(self, piece: str) -> int | None: ...

  def piece(self, i: int) -> str: ...


class _HFTokenizers:
  """A `tokenizer.json` through the `tokenizers` library."""

  def __init__(self, text: str):
    import tokenizers

    self.tok = tokenizers.Tokenizer.from_str(text)
    self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
    model = json.loads(text).get("model") or {}
    self.wordpiece_prefix = (
      model.get("continuing_subword_prefix") or "##" if model.get("type") == "WordPiece" else None
    )

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: list[int]) -> str:
    return self.tok.decode(ids, skip_special_tokens=True)

  def id_of(self, piece: str) -> int | None:
    return self.tok.token_to_id(piece)

  def piece(self, i: int) -> str:
    return self.tok.id_to_token(i) or ""


class _SentencePiece:
  """A SentencePiece model; `extra_ids` sentinels `<extra_id_k>` = size + extra - 1 - k."""

  wordpiece_prefix = None

  def __init__(self, proto: bytes, extra_ids: int):
    import sentencepiece as spm

    self.sp = spm.SentencePieceProcessor(model_proto=proto)
    self.pieces = self.sp.get_piece_size()
    self.extra_ids = extra_ids
    self.vocab_size = self.pieces + extra_ids

  def encode(self, text: str) -> list[int]:
    return self.sp.encode(text)

  def decode(self, ids: list[int]) -> str:
    return self.sp.decode([i for i in ids if i < self.pieces])

  def id_of(self, piece: str) -> int | None:
    if piece.startswith("<extra_id_") and piece.endswith(">"):
      k = piece[len("<extra_id_") : -1]
      if k.isdigit() and int(k) < self.extra_ids:
        return self.vocab_size - 1 - int(k)
    i = self.sp.piece_to_id(piece)
    return i if self.sp.id_to_piece(i) == piece else None  # unknown pieces map to unk

  def piece(self, i: int) -> str:
    if i >= self.pieces:
      return f"<extra_id_{self.vocab_size - 1 - i}>"
    return self.sp.id_to_piece(i)

  def own_specials(self) -> dict[str, int]:
    """The roles the model itself defines (-1 = none)."""
    ids = {"pad": self.sp.pad_id(), "bos": self.sp.bos_id(), "eos": self.sp.eos_id()}
    ids["unk"] = self.sp.unk_id()
    return {role: i for role, i in ids.items() if i >= 0}


class PretrainedTokenizer(Tokenizer):
  """A pretrained vocabulary with its own special ids (see the module docstring)."""

  kind = KIND

  def __init__(self, saved: Mapping[str, Any]):
    """From the dict `save` writes (`from_pretrained_dir` builds one from a directory)."""
    if saved.get("kind") != KIND or saved.get("format") != FORMAT:
      raise ValueError(
        f"not a saved pretrained tokenizer (kind {saved.get('kind')!r}, "
        f"format {saved.get('format')!r}; expected {KIND!r}, {FORMAT})"
      )
    self._saved = dict(saved)
    self.name = str(saved["name"])
    if saved["backend"] == "tokenizers":
      self._backend: _Backend = _HFTokenizers(saved["tokenizer_json"])
    elif saved["backend"] == "sentencepiece":
      proto = base64.b64decode(saved["model_proto"])
      self._backend = _SentencePiece(proto, int(saved["extra_ids"]))
    elif saved["backend"] == "marian":
      self._backend = marian_vocab.MarianVocab.from_saved(saved)
    else:
      raise ValueError(f"{self.name}: unknown tokenizer backend {saved['backend']!r}")
    # Our id <-> the source's: the checkpoint's PAD and 0 trade places (its own inverse).
    self._swap = np.arange(self._backend.vocab_size)  # [V]
    pad = int(saved.get("swapped_pad", 0))
    if not 0 <= pad < self._backend.vocab_size:
      raise ValueError(
        f"{self.name}: swapped_pad={pad} is outside the tokenizer's {self._backend.vocab_size} ids"
      )
    self._swap[[0, pad]] = [pad, 0]
    specials = {r: None if i is None else int(self._swap[i]) for r, i in saved["specials"].items()}
    self.specials: dict[str, int | None] = {r: specials.get(r) for r in ROLES}
    self.sentinels: tuple[int, ...] = tuple(int(self._swap[i]) for i in saved["sentinels"])
    special_ids = {i for i in self.specials.values() if i is not None} | set(self.sentinels)
    special_ids |= {int(self._swap[i]) for i in saved.get("added_special_ids", ())}
    self._special = np.zeros(self.vocab_size, bool)  # [V] ids that never begin a word
    self._special[sorted(special_ids)] = True
    self._starts = np.array([self._begins_word(i) for i in range(self.vocab_size)], bool)

  def __getstate__(self) -> dict:  # picklable for grain workers: the saved dict rebuilds it
    return {"saved": self._saved}

  def __setstate__(self, state: dict) -> None:
    self.__init__(state["saved"])

  def _begins_word(self, i: int) -> bool:
    piece = self.id_to_piece(i)
    prefix = self._backend.wordpiece_prefix
    if prefix is not None:
      return not piece.startswith(prefix)
    return piece.startswith(_WORD_MARKERS)

  def _role(self, role: str) -> int:
    i = self.specials[role]
    if i is None:
      raise ValueError(
        f"pretrained tokenizer {self.name!r} has no {role.upper()} token, which this data "
        f"pipeline needs; its special tokens: {self.present_specials()}"
      )
    return i

  def present_specials(self) -> dict[str, int]:
    return {role: i for role, i in self.specials.items() if i is not None}

  pad_id = property(lambda self: self._role("pad"))
  bos_id = property(lambda self: self._role("bos"))
  eos_id = property(lambda self: self._role("eos"))
  unk_id = property(lambda self: self._role("unk"))
  mask_id = property(lambda self: self._role("mask"))
  cls_id = property(lambda self: self._role("cls"))
  sep_id = property(lambda self: self._role("sep"))

  @property
  def num_special(self) -> int:
    raise ValueError(
      f"pretrained tokenizer {self.name!r} keeps the checkpoint's special ids "
      f"{self.present_specials()}, not one block below the ordinary tokens: masked-LM "
      "corruption and span-corruption sentinels are not supported with it yet"
    )

  def sentinel_id(self, k: int) -> int:
    """The id of T5's sentinel `<extra_id_k>`."""
    if not 0 <= k < len(self.sentinels):
      raise ValueError(
        f"pretrained tokenizer {self.name!r} has {len(self.sentinels)} sentinels, no {k}"
      )
    return self.sentinels[k]

  @property
  def vocab_size(self) -> int:
    return self._backend.vocab_size

  def encode_array(self, text: str) -> np.ndarray:
    return self._swap[np.asarray(self._backend.encode(text), np.int64)].astype(np.int32)

  def encode(self, text: str) -> list[int]:
    return self.encode_array(text).tolist()

  def decode(self, ids: Iterable[int]) -> str:
    return self._backend.decode([int(self._swap[int(i)]) for i in ids])

  def id_to_piece(self, i: int) -> str:
    return self._backend.piece(int(self._swap[int(i)]))

  def word_starts(self, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids)
    special = self._special[ids]  # [L]
    prev_special = np.concatenate([[True], special[:-1]])
    return ~special & (self._starts[ids] | prev_special)

  def chat_template(self) -> tuple[str, dict[str, str]]:
    """(the chat template, the special tokens' texts by role); a `tokenizer.json` only (a
    SentencePiece model would spell those texts out), else refused in one line."""
    template = self._saved.get("chat_template")
    if not template:
      raise ValueError(f"chat: the tokenizer of {self.name} has no chat template")
    if self._saved["backend"] != "tokenizers":
      raise ValueError(f"chat: needs a tokenizer.json ({self.name} has a SentencePiece model)")
    return template, {r: self.id_to_piece(i) for r, i in self.specials.items() if i is not None}

  def encode_chars(self, text: str) -> tuple[np.ndarray, Callable[[int], int | None]]:
    """`encode_array(text)`, and a character's index -> its token's (`tokenizers`')."""
    encoding = self._backend.tok.encode(text, add_special_tokens=False)
    return self._swap[np.asarray(encoding.ids, np.int64)].astype(np.int32), encoding.char_to_token

  def chat_prompt(self, text: str) -> str:
    """`text` as one user message under the chat template, the assistant's turn opened."""
    template, texts = self.chat_template()
    return chat.render(template, [{"role": "user", "content": text}], texts)

  def save(self, path: str | os.PathLike) -> None:
    write_atomic(path, json.dumps(self._saved, sort_keys=True).encode())


def from_pretrained_dir(path: str | os.PathLike) -> PretrainedTokenizer:
  """The tokenizer of a local (or object-storage) Hugging Face model directory."""
  root = epath.Path(path).expanduser()
  present = [name for name in SOURCE_FILES if (root / name).exists()]
  if not present:
    raise FileNotFoundError(f"{root}: no tokenizer file (one of {', '.join(SOURCE_FILES)})")
  role_tokens, config = _role_tokens(root)
  source = present[0]
  saved: dict[str, Any] = {"kind": KIND, "format": FORMAT, "name": root.name, "source": source}
  if source == "tokenizer.json":
    text = (root / source).read_text(encoding="utf-8")
    try:
      backend: _Backend = _HFTokenizers(text)
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
      raise ValueError(f"{root / source}: not a usable tokenizer.json: {e}") from None
    saved |= {"backend": "tokenizers", "tokenizer_json": text}
    added = json.loads(text).get("added_tokens") or []
    saved["added_special_ids"] = sorted(int(t["id"]) for t in added if t.get("special"))
    own: dict[str, int] = {}
  elif source == marian_vocab.SOURCE:
    fields, marian = marian_vocab.read(root, config)
    backend, own = marian, marian.own_specials()
    saved |= {"backend": "marian", **fields, "added_special_ids": []}
  else:
    proto = (root / source).read_bytes()
    default_extra = T5_EXTRA_IDS if source == "spiece.model" else 0
    extra_ids = int(config.get("extra_ids", default_extra))
    try:
      sp_backend = _SentencePiece(proto, extra_ids)
    except (RuntimeError, OSError) as e:  # sentencepiece: RuntimeError on garbage
      raise ValueError(f"{root / source}: not a usable SentencePiece model: {e}") from None
    backend = sp_backend
    saved |= {"backend": "sentencepiece", "extra_ids": extra_ids}
    saved["model_proto"] = base64.b64encode(proto).decode("ascii")
    saved["added_special_ids"] = []
    own = sp_backend.own_specials()
  specials: dict[str, int | None] = {}
  for role in ROLES:
    text = role_tokens.get(role)
    if text is None:
      specials[role] = own.get(role)
      continue
    i = backend.id_of(text)
    if i is None:
      raise ValueError(f"{root}: {role}_token {text!r} is not in the vocabulary")
    specials[role] = i
  sentinels = []
  while (i := backend.id_of(f"<extra_id_{len(sentinels)}>")) is not None:
    sentinels.append(i)
  saved |= {"specials": specials, "sentinels": sentinels, "swapped_pad": _swapped_pad(root)}
  saved["chat_template"] = chat.read_template(root, config)
  return PretrainedTokenizer(saved)


def _swapped_pad(root: epath.Path) -> int:
  """The id the model converter of the directory's config.json swaps with 0 (0: none, or
  no config.json / an architecture without a converter)."""
  file = root / "config.json"
  if not file.exists():
    return 0
  try:
    config = json.loads(file.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise ValueError(f"{file}: not a JSON file: {e}") from None
  architecture = (config.get("architectures") or [None])[0]
  converter = registry.ARCHITECTURES.get(architecture)
  return 0 if converter is None else int(converter.swapped_pad(config))


def load_saved(data: Mapping[str, Any], path: epath.Path) -> PretrainedTokenizer:
  """`load_tokenizer`'s loader for kind 'pretrained' (`data`: the parsed JSON at `path`)."""
  try:
    return PretrainedTokenizer(data)
  except (KeyError, TypeError) as e:
    raise ValueError(f"{path}: incomplete saved pretrained tokenizer: {e!r}") from None


def filename() -> str:
  """The cache file name of `data.tokenizer='pretrained'`."""
  return project_tokenizers.tokenizer_filename(KIND)


def save_to_workdir(tokenizer: PretrainedTokenizer, workdir: str | os.PathLike) -> epath.Path:
  """Writes `workdir/tokenizers/<filename()>`, where `data.tokenizer_from=workdir` (with
  `data.tokenizer='pretrained'`) finds it for any data set; returns the path."""
  path = epath.Path(workdir) / "tokenizers" / filename()
  tokenizer.save(path)
  return path


project_tokenizers.LOADERS[KIND] = load_saved
