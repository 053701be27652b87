"""Chat supervised fine-tuning (SFT) of a decoder: next-token loss on the assistant turns.

A record holds one conversation in `data.text_column` (e.g. 'messages'): a list of
{role, content} messages, read from JSONL, Parquet or a Hub dataset (`data.source='hf'`).
`encode` renders it as token ids and a loss mask:

- a pretrained tokenizer with a chat template (`init_from='hf:DIR'`): the template's own
  ids, equal to transformers' `apply_chat_template`, and the mask of the assistant turns,
  end-of-turn included (`convert.chat.encode`);
- any other tokenizer (a character or byte vocabulary trained on the data): the plain
  template, [BOS] then 'role: content\\n' per message, except that an assistant turn is
  'assistant: ' + content + [EOS]; the mask covers its content and [EOS].

The mask never covers system, user or header tokens. Training rows pack whole
conversations with segment ids (no attention across them); `weights` are the mask on the
targets. A conversation with no assistant turn, or a role the template refuses, stops the
run in one line naming the file and record. `prompt_ids` renders a conversation's opening
turns with the header of the assistant's reply after them (what `exact_match` decodes).

Batches [B, T]: inputs, targets, weights f32, segment_ids, positions (as `lm`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from transformer.convert import chat
from transformer.data import features, packing, pipeline
from transformer.data.config import DataConfig, fail
from transformer.data.spec import DataContext, DataSpec
from transformer.nn.config import ModelConfig
from transformer.tasks.lm import KEYS, LanguageModeling, token_shapes

PLAIN_ROLES = ("system", "user", "assistant")  # the roles of the plain template

Messages = Sequence[Mapping[str, Any]]


def _plain(tok: Any, messages: Messages, generation_prompt: bool) -> tuple[list, list]:
  """(ids, mask) of `messages` under the plain template (module docstring)."""
  ids, mask = [tok.bos_id], [False]
  for m in messages:
    role, content = m["role"], m["content"]
    if role not in PLAIN_ROLES:
      raise ValueError(f"role {role!r}: the plain template takes {', '.join(PLAIN_ROLES)}")
    head = tok.encode(f"{role}: ")
    body = tok.encode(content) + [tok.eos_id] if role == "assistant" else tok.encode(f"{content}\n")
    ids += head + body
    mask += [False] * len(head) + [role == "assistant"] * len(body)
  if generation_prompt:
    head = tok.encode("assistant: ")
    ids, mask = ids + head, mask + [False] * len(head)
  return ids, mask


def encode(tok: Any, messages: Messages) -> tuple[np.ndarray, np.ndarray]:
  """(ids int32 [L], assistant mask bool [L]) of a conversation (module docstring);
  ValueError for a role the template refuses (or a pretrained tokenizer without one)."""
  if hasattr(tok, "chat_template"):
    return chat.encode(tok, messages)
  ids, mask = _plain(tok, messages, generation_prompt=False)
  return np.asarray(ids, np.int32), np.asarray(mask, bool)


def prompt_ids(tok: Any, messages: Messages) -> list[int]:
  """The ids of `messages` followed by the opening of the assistant's reply (the
  template's generation prompt)."""
  if hasattr(tok, "chat_template"):
    template, texts = tok.chat_template()
    return list(tok.encode_chars(chat.render(template, messages, texts))[0])
  return _plain(tok, messages, generation_prompt=True)[0]


def split_reply(messages: Messages) -> tuple[list, str]:
  """(the messages before the last one, its content): a held-out prompt and its answer;
  ValueError unless the last message is the assistant's."""
  if not messages or messages[-1]["role"] != "assistant":
    raise ValueError("the conversation does not end with an assistant turn")
  return list(messages[:-1]), messages[-1]["content"]


@dataclasses.dataclass(frozen=True)
class Conversation(features.TextExample):
  """A record -> unpadded `inputs`, `targets` (the next ids) and `loss_mask` (on targets)."""

  def __call__(self, item: tuple[int, Mapping[str, Any]]) -> dict[str, np.ndarray] | None:
    where = features.where(self.source_name, *item)
    messages = item[1][self.text_key]
    try:
      ids, mask = encode(self.tokenizer, messages)
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{where}: {e}") from None
    if not mask.any():
      roles = [m.get("role") for m in messages]
      raise ValueError(f"{where}: a conversation with no assistant turn to train on: {roles}")
    cut = packing.fit_length(ids, self.seq_len + 1, self.overlong, where)
    if cut is None:
      return None
    mask = mask[: len(cut)]
    cut = cut.astype(np.int32)
    return {"inputs": cut[:-1], "targets": cut[1:], "loss_mask": mask[1:].astype(np.int32)}


def batch_features(ex: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Packed / padded `inputs`, `targets`, `loss_mask` -> the batch keys."""
  weights = (ex["loss_mask"] > 0) & (ex["targets_segment_ids"] > 0)
  return {
    "inputs": ex["inputs"],
    "targets": ex["targets"],
    "weights": weights.astype(np.float32),
    "segment_ids": ex["inputs_segment_ids"],
    "positions": ex["inputs_positions"],
  }


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  b, source = c.batching(train, rows), c.source(train)
  example = Conversation(c.tok, c.seq_len, c.text_key, b.overlong, c.splits.name)
  lengths = {"inputs": c.seq_len, "targets": c.seq_len, "loss_mask": c.seq_len}
  ds = pipeline.to_rows(pipeline.examples(source, b).map(example), lengths, b)
  return pipeline.batches(ds.map(batch_features), len(source), b)


def check_records(data: DataConfig, task: str, records: str) -> None:
  """A task that reads whole `records` (e.g. conversations) through source 'hf' only."""
  if data.source != "hf":
    rule = f"{task} reads {records} through source 'hf' (JSONL, Parquet, a dataset)"
    fail("data.source", data.source, rule)
  if data.windows:
    fail("data.windows", data.windows, f"{task} reads whole {records}")


@dataclasses.dataclass(frozen=True)
class ChatFineTuning(LanguageModeling):
  """`lm`'s step on the batches above: the cross-entropy of the weighted targets."""

  name = "sft"
  evaluators = ("exact_match",)

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    check_records(data, "the sft task", "conversations")

  def data_spec(self) -> DataSpec:
    return DataSpec(
      build=_build,
      shapes=token_shapes(KEYS),
      conversations=True,
      packing_key="segment_ids",
    )
