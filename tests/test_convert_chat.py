"""Chat templates (`transformer.convert.chat`, `eval.py --chat`) against `transformers`'
own `apply_chat_template`.

A byte-level BPE with ChatML's special tokens (`<|im_start|>`, `<|im_end|>`) is saved by
`transformers` with a ChatML template (as Qwen's); a second directory keeps its template in
`chat_template.jinja` and uses `bos_token` / `eos_token` and a loop control. The ids of
the rendered prompt must equal HF's, token for token.
"""

from __future__ import annotations

import json

import pytest
from conftest import byte_level_bpe

from transformer.convert import tokenizers as pretrained

CHATML = (
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
  "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BOS_EOS = (
  "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
  "[{{ m['role'] | upper }}] {{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}"
  "{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
)
CORPUS = ["Hello there, how are you today?", "ROMEO: what light through yonder window"] * 8
MESSAGES = [{"role": "user", "content": "  What light through yonder window breaks?  "}]


def _directory(path, template, in_file: bool):
  from transformers import PreTrainedTokenizerFast

  tok = byte_level_bpe(CORPUS, ["<s>", "</s>", "<|im_start|>", "<|im_end|>"], vocab_size=280)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
  fast.chat_template = template
  fast.save_pretrained(path)
  config = json.loads((path / "tokenizer_config.json").read_text())
  if in_file:  # the newer layout: the template in its own file
    config.pop("chat_template", None)
    (path / "chat_template.jinja").write_text(template)
  else:
    config["chat_template"] = template
    (path / "chat_template.jinja").unlink(missing_ok=True)
  (path / "tokenizer_config.json").write_text(json.dumps(config))
  return path


@pytest.mark.parametrize(
  "template, in_file", [(CHATML, False), (BOS_EOS, True)], ids=["chatml-config", "bos-eos-file"]
)
def test_chat_prompts_encode_as_hugging_faces(template, in_file, tmp_path):
  from transformers import AutoTokenizer

  path = _directory(tmp_path, template, in_file)
  ours = pretrained.from_pretrained_dir(path)
  text = ours.chat_prompt(MESSAGES[0]["content"])
  hf = AutoTokenizer.from_pretrained(path)
  want = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
  assert text == want
  encoded = hf.apply_chat_template(
    MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True
  )
  want_ids = list(encoded["input_ids"])
  assert ours.encode(text) == want_ids
  added = set(hf.convert_tokens_to_ids(["<s>", "</s>", "<|im_start|>", "<|im_end|>"]))
  assert added & set(want_ids)  # the special tokens encode as their ids, not spelled out


def test_no_template_or_a_sentencepiece_model_is_one_line(tmp_path):
  path = _directory(tmp_path, CHATML, False)
  config = json.loads((path / "tokenizer_config.json").read_text())
  del config["chat_template"]
  (path / "tokenizer_config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match=r"chat: the tokenizer of .* has no chat template"):
    pretrained.from_pretrained_dir(path).chat_prompt("hi")
