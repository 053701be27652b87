"""Conversations under real chat templates (`convert.chat.encode`) against `transformers`'
`apply_chat_template`: the same ids, and an assistant mask that covers exactly each
assistant turn's content and end-of-turn token.

The templates are those of Llama 3.1, Qwen3, Gemma 3, Mistral Instruct and ChatML, copied
into tests/fixtures/chat_templates (its README names each source), plus one with
`{% generation %}` blocks, whose mask must equal `return_assistant_tokens_mask`. They
run over one byte-level BPE that holds all their special tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import byte_level_bpe

from transformer.convert import chat
from transformer.convert import tokenizers as pretrained

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
SPECIALS = [
  "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
  "<|im_start|>", "<|im_end|>", "<think>", "</think>",
  "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<s>", "</s>", "[INST]", "[/INST]",
]  # fmt: skip
# name -> (bos, eos, the end-of-turn text that closes an assistant turn)
FAMILIES = {
  "llama3": ("<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>"),
  "qwen3": (None, "<|im_end|>", "<|im_end|>"),
  "gemma3": ("<bos>", "<eos>", "<end_of_turn>"),
  "mistral": ("<s>", "</s>", "</s>"),
  "chatml": (None, "<|im_end|>", "<|im_end|>"),
}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TURNS = [
  {"role": "user", "content": "What light through yonder window breaks?"},
  {"role": "assistant", "content": "It is the east, and Juliet is the sun."},
  {"role": "user", "content": "Who is already sick and pale with grief?"},
  {"role": "assistant", "content": "The envious moon, 2 + 3 = 5."},
]
CONVERSATIONS = {
  "one-turn": [SYSTEM, *TURNS[:2]],
  "two-turns": [SYSTEM, *TURNS],
  "no-system": TURNS,
}
CORPUS = [m["content"] for m in [SYSTEM, *TURNS]] * 8


def _directory(path: Path, name: str) -> Path:
  from transformers import PreTrainedTokenizerFast

  bos, eos, _ = FAMILIES.get(name, (None, "<|im_end|>", None))
  tok = byte_level_bpe(CORPUS, SPECIALS)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
  fast.chat_template = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
  fast.save_pretrained(path)
  return path


def _pair(tmp_path: Path, name: str):
  from transformers import AutoTokenizer

  path = _directory(tmp_path / name, name)
  return pretrained.from_pretrained_dir(path), AutoTokenizer.from_pretrained(path)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
  """[start, end) of each run of True."""
  edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
  return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_conversations_encode_as_hugging_faces_with_masks_of_the_assistant_turns(name, tmp_path):
  ours, hf = _pair(tmp_path, name)
  eot = FAMILIES[name][2]
  for label, messages in CONVERSATIONS.items():
    ids, mask = chat.encode(ours, messages)
    text = hf.apply_chat_template(messages, tokenize=False)
    want = hf.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert ids.tolist() == list(want), (label, text)
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    space = " " if name == "mistral" else ""  # '[/INST] reply</s>': the reply's first token
    expected = [space + reply + eot for reply in replies]
    if name == "qwen3":  # the turn after the last question keeps its (empty) thinking block
      expected[-1] = "<think>\n\n</think>\n\n" + expected[-1]
    got = [hf.backend_tokenizer.decode(ids[a:b].tolist(), False) for a, b in _runs(mask)]
    assert got == expected, (label, text)


@pytest.mark.parametrize(
  "name, kwargs",
  [
    ("llama3", {}),
    ("qwen3", {"enable_thinking": True}),
    ("qwen3", {"enable_thinking": False}),
    ("gemma3", {}),
    ("mistral", {}),
    ("chatml", {}),
  ],
  ids=["llama3", "qwen3-thinking", "qwen3-no-thinking", "gemma3", "mistral", "chatml"],
)
def test_prompts_with_the_generation_prompt_encode_as_hugging_faces(name, kwargs, tmp_path):
  ours, hf = _pair(tmp_path, name)
  template, texts = ours.chat_template()
  messages = CONVERSATIONS["two-turns"][:-1]  # ends with the user's question
  text = chat.render(template, messages, texts, True, **kwargs)
  want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
  assert text == want
  want = hf.apply_chat_template(
    messages, add_generation_prompt=True, tokenize=True, return_dict=True, **kwargs
  )
  assert ours.encode(text) == list(want["input_ids"])


def test_generation_blocks_give_hugging_faces_assistant_mask(tmp_path):
  ours, hf = _pair(tmp_path, "generation")
  for label, messages in CONVERSATIONS.items():
    ids, mask = chat.encode(ours, messages)
    want = hf.apply_chat_template(
      messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids.tolist() == list(want["input_ids"]), label
    assert mask.astype(int).tolist() == list(want["assistant_masks"]), label
    assert mask.any(), label


def test_a_turn_the_template_does_not_render_is_one_line():
  users_only = (
    "{% for m in messages %}{% if m['role'] != 'assistant' %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
  )
  with pytest.raises(ValueError) as e:
    chat.assistant_spans(users_only, CONVERSATIONS["two-turns"], {})
  assert str(e.value) == "chat template: assistant message 2's content is not in the conversation"


def test_a_template_that_refuses_the_conversation_names_the_checkpoint_and_its_words(tmp_path):
  ours, _ = _pair(tmp_path, "mistral")
  with pytest.raises(ValueError) as e:
    chat.encode(ours, [TURNS[0], TURNS[2]])  # two user turns in a row
  rule = "chat template: After the optional system message, conversation roles must alternate"
  assert str(e.value).startswith(f"mistral: {rule}") and "\n" not in str(e.value)
  broken = "{{ messages[0]['content'] }}{{ undefined_thing.field }}"
  with pytest.raises(ValueError, match=r"^chat template: UndefinedError: 'undefined_thing' is"):
    chat.render(broken, TURNS, {})
