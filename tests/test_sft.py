"""The `sft` task (transformer/tasks/sft.py) and the `exact_match` evaluator: conversations
read through `data.source='hf'`, the loss mask on the assistant turns (plain template and a
checkpoint's own), packed rows scored as each conversation alone, the greedy held-out
answers, and the bad inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import grain
import jax
import numpy as np
import pytest
from test_recipes import make_tiny_hf, tiny

from transformer import tasks
from transformer.convert import chat
from transformer.convert import tokenizers as pretrained
from transformer.data import features, packing, sources
from transformer.data.config import DataConfig
from transformer.data.tokenizers import CharTokenizer
from transformer.decode import generate
from transformer.eval.evaluate import evaluate, restore
from transformer.evaluators import exact_match
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.tasks import sft
from transformer.train import experiment, setup
from transformer.train import loop as train_lib

CONVERSATIONS = [
  [{"role": "user", "content": "12+7="}, {"role": "assistant", "content": "19"}],
  [
    {"role": "system", "content": "add"},
    {"role": "user", "content": "3+4="},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "and 5*6="},
    {"role": "assistant", "content": "30"},
  ],
  [{"role": "user", "content": "100*3="}, {"role": "assistant", "content": "300"}],
]


def _char_tokenizer() -> CharTokenizer:
  return CharTokenizer.train([features.conversation_text(c) for c in CONVERSATIONS])


def _write_jsonl(root: Path, rows: dict[str, list]) -> Path:
  root.mkdir(parents=True, exist_ok=True)
  for split, conversations in rows.items():
    lines = [json.dumps({"messages": c}) for c in conversations]
    (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
  return root


def test_the_plain_mask_is_the_assistant_replies_and_their_eos():
  tok = _char_tokenizer()
  for conversation in CONVERSATIONS:
    ids, mask = sft.encode(tok, conversation)
    replies = [m["content"] for m in conversation if m["role"] == "assistant"]
    want = [i for r in replies for i in [*tok.encode(r), tok.eos_id]]
    assert ids[mask].tolist() == want
    assert ids[0] == tok.bos_id and not mask[0]
    assert tok.decode(ids[~mask][1:].tolist()) == "".join(
      f"{m['role']}: {m['content']}\n" if m["role"] != "assistant" else "assistant: "
      for m in conversation
    )  # the rest: every header, system and user turn, nothing of the replies


def test_a_checkpoints_template_gives_its_ids_and_mask(tmp_path):
  """The tiny GPT-2's template: the ids and mask of `chat.encode` (equal to transformers',
  tests/test_chat_masks.py), whose masked ids decode to each reply and its EOS."""
  script = make_tiny_hf()
  path = tmp_path / "gpt2"
  path.mkdir()
  script.gpt2_tokenizer(path, script.corpus(60))
  tok = pretrained.from_pretrained_dir(path)
  conversation = CONVERSATIONS[1]
  ids, mask = sft.encode(tok, conversation)
  want_ids, want_mask = chat.encode(tok, conversation)
  assert ids.tolist() == want_ids.tolist() and mask.tolist() == want_mask.tolist()
  assert _replies(tok, ids[mask].tolist()) == ["7", "30"]
  prompt = sft.prompt_ids(tok, conversation[:1])
  assert tok.decode(prompt).endswith("assistant: ")


def _replies(tok, weighted: list[int]) -> list[str]:
  """The texts between the EOS ids of `weighted`, which must end with one."""
  assert weighted and weighted[-1] == tok.eos_id
  cuts = [i for i, t in enumerate(weighted) if t == tok.eos_id]
  return [
    tok.decode(weighted[a + 1 : b]).strip() for a, b in zip([-1, *cuts[:-1]], cuts, strict=True)
  ]


def _model(vocab: int) -> tuple:
  config = ModelConfig(family="decoder", vocab_size=vocab, d_model=32, num_heads=2,
                       num_layers=2, d_ff=64, max_len=128, dropout_rate=0.0)  # fmt: skip
  model = build_model(config)
  params = model.init(jax.random.PRNGKey(0), np.ones((1, 8), np.int32))["params"]
  return model, params


def test_a_packed_row_scores_each_conversation_as_it_scores_alone():
  tok = _char_tokenizer()
  example = sft.Conversation(tok, 128, "messages")
  examples = [example((i, {"messages": c})) for i, c in enumerate(CONVERSATIONS)]
  lengths = {"inputs": 128, "targets": 128, "loss_mask": 128}
  ds = grain.MapDataset.source(examples).to_iter_dataset()
  (row,) = list(packing.pack(ds, lengths, num_packing_bins=1))
  packed = {k: v[None] for k, v in sft.batch_features(row).items()}
  assert sorted(set(packed["segment_ids"][0])) == [0, 1, 2, 3]  # all three in one row
  task = tasks.get("sft")()
  model, params = _model(tok.vocab_size)

  def loss(batch):
    bound = model.bind({"params": params})
    total, count, _ = task.loss(bound, batch, True, None)
    return float(total), float(count)

  alone = []
  for ex in examples:
    padded = packing.pad_example(ex, lengths)
    alone.append(loss({k: v[None] for k, v in sft.batch_features(padded).items()}))
  total, count = loss(packed)
  assert count == sum(c for _, c in alone) == sum(int(e["loss_mask"].sum()) for e in examples)
  np.testing.assert_allclose(total, sum(t for t, _ in alone), rtol=1e-5)


def test_conversations_are_read_from_jsonl_through_the_hf_source(tmp_path):
  root = _write_jsonl(tmp_path / "chat", {"train": CONVERSATIONS, "test": CONVERSATIONS[:1]})
  cfg = DataConfig(kind="sft", source="hf", path=str(root), eval_split="test",
                   text_column="messages", tokenizer="char")  # fmt: skip
  splits = sources.open_splits(cfg, str(tmp_path), conversations=True)
  assert [splits.train[i]["messages"] for i in range(3)] == CONVERSATIONS
  with pytest.raises(ValueError) as error:  # an lm run reads text, not conversations
    sources.open_splits(cfg.replace(kind="lm"), str(tmp_path))
  assert str(error.value).startswith("config.data.text_column='messages': column of ")
  assert str(error.value).endswith("holds List, expected text (string)")
  text = _write_jsonl(tmp_path / "text", {"train": [], "test": []})
  (text / "train.jsonl").write_text('{"messages": "hi"}\n')
  (text / "test.jsonl").write_text('{"messages": "hi"}\n')
  with pytest.raises(ValueError, match=r"holds string, expected conversations: lists of "):
    sources.open_splits(cfg.replace(path=str(text)), str(tmp_path), conversations=True)


@pytest.mark.parametrize(
  ("conversation", "message"),
  [
    (
      [{"role": "user", "content": "1+1="}],
      "chat [train][record 4]: a conversation with no assistant turn to train on: ['user']",
    ),
    (
      [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "1"}],
      "chat [train][record 4]: role 'tool': the plain template takes system, user, assistant",
    ),
  ],
)
def test_a_bad_conversation_is_one_line_naming_the_record(conversation, message):
  example = sft.Conversation(_char_tokenizer(), 64, "messages", source_name="chat [train]")
  with pytest.raises(ValueError) as error:
    example((4, {"messages": conversation}))
  assert str(error.value) == message


def test_the_task_reads_conversations_through_the_hf_source_only():
  config = tiny("sft_arith")
  config.data.source = "text"
  with pytest.raises(ValueError, match=r"^config.data.source='text': the sft task reads "):
    experiment.validate(config)


def test_sft_arith_trains_and_answers_held_out_prompts_greedily(tmp_path):
  """Two steps of the recipe; its exact match equals the one computed here prompt by
  prompt (unbatched, unpadded greedy decoding of `tasks.sft.prompt_ids`)."""
  config = tiny("sft_arith", **{"evaluate.exact_match.every": 2})
  metrics = train_lib.train_and_evaluate(config, str(tmp_path))
  assert math.isfinite(metrics["loss"]) and 0.0 <= metrics["exact_match"] <= 1.0
  s, state, _ = restore(str(tmp_path))
  params = state.params
  pairs = exact_match.held_out(s.exp.data, str(tmp_path), 16)
  assert len(pairs) == 16
  tok, answers = s.info.tokenizer, []
  rows = [sft.prompt_ids(tok, messages) for messages, _ in pairs]
  new = min(32, s.model_cfg.max_len - max(len(r) for r in rows))  # room after the longest
  for row in rows:
    out = generate(s.model, params, [row], max_new_tokens=new, method="greedy", eos_id=tok.eos_id)
    ids = [int(i) for i in out.tokens[0]]
    ids = ids[: ids.index(tok.eos_id)] if tok.eos_id in ids else ids
    answers.append(tok.decode(ids).strip())
  assert answers == exact_match.greedy_answers(s.model, params, tok, [p for p, _ in pairs], 32)
  want = sum(a == r.strip() for a, (_, r) in zip(answers, pairs, strict=True)) / 16
  assert metrics["exact_match"] == want
  options = {"exact_match": exact_match.ExactMatchOptions(examples=16)}
  result = evaluate(str(tmp_path), options=options)  # eval.py's path
  assert result["exact_match"] == want and len(result["examples"]) == 5
  assert [e["hypothesis"] for e in result["examples"]] == answers[:5]


def test_sft_chat_trains_lora_on_the_template_of_the_checkpoint(tmp_path):
  """configs/sft_chat.py on the tiny GPT-2 (its chat template): each row of its first
  training batch is weighted on whole replies and their EOS only, and two steps train."""
  gpt2 = make_tiny_hf().make("gpt2", tmp_path / "gpt2", texts=make_tiny_hf().corpus(60))
  config = tiny("sft_chat", init_from=f"hf:{gpt2}")
  exp = experiment.validate(config, str(tmp_path / "run"))
  s = setup.build(exp, str(tmp_path / "run"))
  batch = next(iter(s.train_iter))
  tok = s.info.tokenizer
  for targets, weights in zip(batch["targets"], batch["weights"], strict=True):
    replies = _replies(tok, targets[weights > 0].tolist())
    assert replies and all(r.isdigit() for r in replies), replies
  assert exp.model.lora_rank == 8
  metrics = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
  assert math.isfinite(metrics["loss"])
