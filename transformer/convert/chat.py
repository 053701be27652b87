"""Chat templates: the Jinja template a Hugging Face tokenizer carries, rendered as
`transformers`' `apply_chat_template` renders it.

The template comes from `tokenizer_config.json` (`chat_template`: a string, or a list of
named templates of which 'default' is used) or from `chat_template.jinja` beside it, and
is kept with the run's saved tokenizer. It renders in a sandboxed Jinja environment with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, `raise_exception`,
`strftime_now` and a `tojson` filter, as `transformers` does, given `messages`,
`add_generation_prompt` and the special tokens' texts (`bos_token`, `eos_token`, ...).
`eval.py --chat` wraps each `--prompt` as one user message this way.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

TEMPLATE_FILE = "chat_template.jinja"


def read_template(root: epath.Path, config: Mapping[str, Any]) -> str | None:
  """The chat template of a checkpoint directory (`config`: its tokenizer_config.json)."""
  template = config.get("chat_template")
  if isinstance(template, list):  # [{'name': ..., 'template': ...}, ...]
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
    template = named.get("default")
  if template is None and (root / TEMPLATE_FILE).exists():
    template = (root / TEMPLATE_FILE).read_text(encoding="utf-8")
  if template is not None and not isinstance(template, str):
    raise ValueError(f"{root}: chat_template is not a string or a list with a 'default'")
  return template


def _raise(message: str):
  raise ValueError(f"chat template: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)  # fmt: skip


def render(
  template: str,
  messages: Sequence[Mapping[str, Any]],
  special_tokens: Mapping[str, str],
  add_generation_prompt: bool = True,
) -> str:
  """The text of `messages` ([{'role': 'user', 'content': ...}, ...]) under `template`.

  special_tokens: role -> text ('bos' -> '<s>', ...), given to the template as bos_token,
  eos_token, ...
  """
  import jinja2
  import jinja2.ext
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
  )
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  tokens = {f"{role}_token": text for role, text in special_tokens.items()}
  try:
    compiled = env.from_string(template)
  except jinja2.TemplateError as e:
    raise ValueError(f"chat template: does not parse ({e})") from None
  return compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                         **tokens)  # fmt: skip
