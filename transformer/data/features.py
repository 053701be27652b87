"""Per-example transforms from source records to model features, one class per family.

Each transform is a small picklable callable (grain may run it in worker processes).
Records are TFDS data-source dicts (text as UTF-8 bytes). Transforms receive
`(index, record)`; `index` and the record's `line` (local builders) name the example in
errors. Token rows use the id convention of `tokenizers` (0 = PAD, ...).

Shapes: T row length (targets length in seq2seq), S inputs length in seq2seq,
H, W, C image height, width, channels.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from transformer.data import images, masking, packing
from transformer.data.tokenizers import CLS_ID, NUM_SPECIAL, PAD_ID, SEP_ID, Tokenizer

Record = Mapping[str, Any]


def text_of(record: Record, key: str) -> str:
  """The text of `record[key]`; of a conversation, its `conversation_text`."""
  value = record[key]
  if isinstance(value, list):
    return conversation_text(value)
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
  """A conversation as plain text, one 'role: content' line per message: what a
  tokenizer without a chat template reads of it (`tasks/sft.py`), and trains on."""
  return "".join(f"{m['role']}: {m['content']}\n" for m in messages)


def read_records(
  source: Sequence, indices: Iterable[int], chunk: int = 1024
) -> Iterator[tuple[int, Record]]:
  """`(index, record)` for `indices`, read in bulk (`__getitems__`) where the source can."""
  bulk = getattr(source, "__getitems__", None)
  indices = iter(indices)
  while block := list(itertools.islice(indices, chunk)):
    records = bulk(block) if bulk else [source[i] for i in block]
    yield from zip(block, records, strict=True)


def where(source_name: str, index: int, record: Record) -> str:
  """'file:line' for local data, 'name[record i]' otherwise."""
  if "line" in record:
    return f"{source_name}:{int(record['line'])}"
  return f"{source_name}[record {index}]"


@dataclasses.dataclass(frozen=True)
class Windows:
  """A window of the token stream starting at `start`: int32 [T] `inputs`, `targets`, ...

  `targets` are the next tokens. A window cut short by the end of the stream is padded
  (weights 0, segment id 0).
  """

  tokens: np.ndarray  # int32 [N], the whole split
  seq_len: int

  def __call__(self, start: int) -> dict[str, np.ndarray]:
    t = self.seq_len
    w = self.tokens[start : start + t + 1]  # [<= T + 1]
    ex = packing.pad_example({"inputs": w[:-1], "targets": w[1:]}, {"inputs": t, "targets": t})
    return lm_batch_features(ex)


def lm_batch_features(ex: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Packed / padded `inputs` + `targets` -> the LM batch keys."""
  return {
    "inputs": ex["inputs"],
    "targets": ex["targets"],
    "weights": (ex["targets_segment_ids"] > 0).astype(np.float32),
    "segment_ids": ex["inputs_segment_ids"],
    "positions": ex["inputs_positions"],
  }


@dataclasses.dataclass(frozen=True)
class TextExample:
  """The text of a record as token ids within a row of T (`LMExample`, `MLMExample`)."""

  tokenizer: Tokenizer
  seq_len: int
  text_key: str = "text"
  overlong: str = "truncate"
  source_name: str = ""

  def text_ids(self, record: Record) -> np.ndarray:
    return self.tokenizer.encode_array(text_of(record, self.text_key))

  def fit(self, ids: np.ndarray, length: int, item: tuple[int, Record]) -> np.ndarray | None:
    """`ids` cut to `length` under the overlong policy (None: skipped)."""
    return packing.fit_length(ids, length, self.overlong, where(self.source_name, *item))


@dataclasses.dataclass(frozen=True)
class LMExample(TextExample):
  """A record -> `inputs` = [BOS] + text, `targets` = text + [EOS] (unpadded, <= T each)."""

  def __call__(self, item: tuple[int, Record]) -> dict[str, np.ndarray] | None:
    tok = self.tokenizer
    ids = np.concatenate([[tok.bos_id], self.text_ids(item[1]), [tok.eos_id]])
    ids = self.fit(ids, self.seq_len + 1, item)
    if ids is None:
      return None
    ids = ids.astype(np.int32)
    return {"inputs": ids[:-1], "targets": ids[1:]}


@dataclasses.dataclass(frozen=True)
class MLMExample(TextExample):
  """A record -> `inputs` = [CLS] + text + [SEP] (unpadded, <= T)."""

  def __call__(self, item: tuple[int, Record]) -> dict[str, np.ndarray] | None:
    ids = self.fit(self.text_ids(item[1]), self.seq_len - 2, item)
    if ids is None:
      return None
    tok = self.tokenizer
    return {"inputs": np.concatenate([[tok.cls_id], ids, [tok.sep_id]]).astype(np.int32)}


@dataclasses.dataclass(frozen=True)
class MLMWindow:
  """A stream window of T - 2 tokens -> `inputs` = [CLS] + window + [SEP] (<= T)."""

  tokens: np.ndarray  # int32 [N]
  seq_len: int

  def __call__(self, start: int) -> dict[str, np.ndarray]:
    w = self.tokens[start : start + self.seq_len - 2]
    return {"inputs": np.concatenate([[CLS_ID], w, [SEP_ID]]).astype(np.int32)}


@dataclasses.dataclass(frozen=True)
class Mask:
  """Packed / padded `inputs` -> the MLM batch keys, corrupted by `masking.mask_tokens`."""

  tokenizer: Tokenizer
  mask_rate: float = 0.15
  whole_word: bool = False

  def __post_init__(self) -> None:  # masking draws ordinary ids from [NUM_SPECIAL, vocab_size)
    if self.tokenizer.num_special != NUM_SPECIAL:
      raise ValueError(f"masking needs the special ids below {NUM_SPECIAL}")

  def __call__(
    self, ex: Mapping[str, np.ndarray], rng: np.random.Generator
  ) -> dict[str, np.ndarray]:
    ids = ex["inputs"]  # [T]
    starts = self.tokenizer.word_starts(ids) if self.whole_word else None
    inputs, weights = masking.mask_tokens(
      ids, rng, self.tokenizer.vocab_size, mask_rate=self.mask_rate, word_starts=starts
    )
    return {
      "inputs": inputs,
      "targets": ids.astype(np.int32),
      "weights": weights,
      "segment_ids": ex["inputs_segment_ids"],
      "positions": ex["inputs_positions"],
    }


@dataclasses.dataclass(frozen=True)
class Classification:
  """A record -> `inputs` [CLS] + text (+ [SEP]) padded to T, `segment_ids`, `positions`,
  `label`.

  `sep_id` set: rows are `[CLS] text [SEP]` (BERT's pretraining rows; a truncated text
  keeps its [SEP]); None: `[CLS] text`.
  """

  tokenizer: Tokenizer
  seq_len: int
  text_key: str = "text"
  label_key: str = "label"
  overlong: str = "truncate"
  source_name: str = ""
  sep_id: int | None = None

  def __call__(self, item: tuple[int, Record]) -> dict[str, np.ndarray] | None:
    index, record = item
    end = [] if self.sep_id is None else [[self.sep_id]]  # the parts after the text
    ids = self.tokenizer.encode_array(text_of(record, self.text_key))
    ids = packing.fit_length(
      ids, self.seq_len - 1 - len(end), self.overlong, where(self.source_name, index, record)
    )
    if ids is None:
      return None
    ids = np.concatenate([[self.tokenizer.cls_id], ids, *end])  # [<= T]
    ex = packing.pad_example({"inputs": ids}, {"inputs": self.seq_len})
    return {
      "inputs": ex["inputs"],
      "segment_ids": ex["inputs_segment_ids"],
      "positions": ex["inputs_positions"],
      "label": np.int32(record[self.label_key]),
    }


@dataclasses.dataclass(frozen=True)
class Translation:
  """A record -> `inputs` = source + [EOS], `targets` = target + [EOS] (unpadded)."""

  tokenizer: Tokenizer
  inputs_len: int
  targets_len: int
  source_key: str
  target_key: str
  overlong: str = "truncate"
  source_name: str = ""

  def __post_init__(self) -> None:  # rows pad with 0, which the decoder also starts from
    if self.tokenizer.pad_id != PAD_ID:
      raise ValueError(f"seq2seq needs PAD = {PAD_ID}, got {self.tokenizer.pad_id}")

  def __call__(self, item: tuple[int, Record]) -> dict[str, np.ndarray] | None:
    index, record = item
    out = {}
    for name, key, length in (
      ("inputs", self.source_key, self.inputs_len),
      ("targets", self.target_key, self.targets_len),
    ):
      ids = self.tokenizer.encode_array(text_of(record, key))
      ids = packing.fit_length(
        ids, length - 1, self.overlong, f"{where(self.source_name, index, record)} ({key})"
      )
      if ids is None:
        return None
      out[name] = np.concatenate([ids, [self.tokenizer.eos_id]]).astype(np.int32)
    return out


@dataclasses.dataclass(frozen=True)
class Image:
  """A record -> `image` float32 [H, W, C] (augmented if training, normalised), `label`."""

  mean: Sequence[float]
  std: Sequence[float]
  crop_padding: int = 0
  flip: bool = False
  image_key: str = "image"
  label_key: str = "label"
  image_size: int | None = None  # resize + centre crop to [S, S] first (varying sizes)

  def __call__(
    self, item: tuple[int, Record], rng: np.random.Generator | None = None
  ) -> dict[str, np.ndarray]:
    _, record = item
    image = np.asarray(record[self.image_key])
    if image.ndim == 2:
      image = image[..., None]  # [H, W, 1]
    if self.image_size:
      image = images.resize_center_crop(image, self.image_size)  # [S, S, C]
    if rng is not None:
      image = images.augment(image, rng, self.crop_padding, self.flip)
    return {
      "image": images.normalize(image, self.mean, self.std),
      "label": np.int32(record[self.label_key]),
    }


@dataclasses.dataclass(frozen=True)
class ImageBatch:
  """Indices [B] into images held in memory -> the batch `Image` would make of them:
  `image` float32 [B, H, W, C] (augmented a batch at a time if training, normalised),
  `label` int32 [B]."""

  images: np.ndarray  # uint8 [N, H, W, C]
  labels: np.ndarray  # int32 [N]
  mean: Sequence[float]
  std: Sequence[float]
  crop_padding: int = 0
  flip: bool = False

  def __call__(
    self, indices: np.ndarray, rng: np.random.Generator | None = None
  ) -> dict[str, np.ndarray]:
    indices = np.asarray(indices)
    batch = self.images[indices]  # [B, H, W, C]
    if rng is not None:
      batch = images.augment_batch(batch, rng, self.crop_padding, self.flip)
    return {"image": images.normalize(batch, self.mean, self.std), "label": self.labels[indices]}
