"""Chat templates: the Jinja template a Hugging Face tokenizer carries, rendered as
`transformers`' `apply_chat_template` renders it, and a conversation's ids with the mask
of its assistant turns.

The template comes from `tokenizer_config.json` (`chat_template`: a string, or a list of
named templates of which 'default' is used) or from `chat_template.jinja` beside it, and
is kept with the run's saved tokenizer. It renders in a sandboxed Jinja environment with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, the `{% generation %}`
tag, `raise_exception`, `strftime_now`, `dict`, a `namespace` that refuses underscore
names and a `tojson` filter, as `transformers` does, given `messages` (keys whose value
is None dropped), `tools` and `documents` (None), `add_generation_prompt`, the special
tokens' texts (`bos_token`, `eos_token`, ...) and any other keyword (Qwen3's
`enable_thinking`). `eval.py --chat` wraps each `--prompt` as one user message this way.

The assistant mask (`encode`) covers each assistant turn as the model is to produce it:
its content and its end-of-turn token, never the system, user or generation-prompt
tokens. Where the template marks those turns with `{% generation %}` blocks, the mask is
`transformers`' `return_assistant_tokens_mask`: the tokens from the one holding a block's
first character to the one holding its last. Elsewhere each turn's characters come from
rendering prefixes (`assistant_spans`): turn i starts where the conversation before it
plus the generation prompt ends, and ends where the conversation through it ends (the
whitespace that separates turns left out). Where a template renders those prefixes
otherwise once other messages follow (Qwen3 drops the empty thinking block of earlier
turns; Mistral moves the system prompt to the last user turn), the turn is found around
its content (the characters that change with it): it starts after the last generation
prompt before the content (a template without one: at the whitespace before it) and ends
at the first end-of-turn text after it, the text the template puts after an assistant
content.

Letters: L tokens.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

TEMPLATE_FILE = "chat_template.jinja"

Span = tuple[int, int]  # [start, end) characters of the rendered text


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


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> Any:
  """The template compiled in `transformers`' environment (see the module docstring); its
  `{% generation %}` blocks append their [start, end) to `environment.state.spans` while
  `environment.state.blocks` (the text rendered so far) is a list: per thread, since
  the data loader's threads render with the same compiled template. Kept for the next
  call."""
  import jinja2
  import jinja2.ext
  from jinja2 import nodes
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class Generation(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

    def _track(self, caller) -> str:
      text = caller()
      state = self.environment.state
      if getattr(state, "blocks", None) is not None:
        start = len("".join(state.blocks))
        state.spans.append((start, start + len(text)))
      return text

  class Namespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):  # noqa: N805 (Jinja's own signature)
      self, args = args[0], args[1:]
      attrs = dict(*args, **kwargs)
      for name in attrs:
        Namespace._check(name)
      jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
      Namespace._check(name)
      jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
      if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is refused")

  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
  )
  env.state = threading.local()  # blocks and spans of the rendering in this thread
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  env.globals["dict"] = dict
  env.globals["namespace"] = Namespace
  try:
    return env.from_string(template)
  except jinja2.TemplateError as e:
    raise ValueError(f"chat template: does not parse ({e})") from None


def _variables(messages, special_tokens, add_generation_prompt, kwargs) -> dict[str, Any]:
  tokens = {f"{role}_token": text for role, text in special_tokens.items()}
  plain = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
  return {
    **tokens,
    "messages": plain,
    "tools": None,
    "documents": None,
    "add_generation_prompt": add_generation_prompt,
    **kwargs,
  }


def render(
  template: str,
  messages: Sequence[Mapping[str, Any]],
  special_tokens: Mapping[str, str],
  add_generation_prompt: bool = True,
  **kwargs: Any,
) -> str:
  """The text of `messages` ([{'role': 'user', 'content': ...}, ...]) under `template`.

  special_tokens: role -> text ('bos' -> '<s>', ...), given to the template as bos_token,
  eos_token, ...; kwargs: further template variables (`enable_thinking=False`).
  """
  variables = _variables(messages, special_tokens, add_generation_prompt, kwargs)
  return _rendering(lambda: _compile(template).render(**variables))


def generation_spans(
  template: str,
  messages: Sequence[Mapping[str, Any]],
  special_tokens: Mapping[str, str],
  **kwargs: Any,
) -> tuple[str, list[Span]]:
  """The conversation's text (no generation prompt) and the spans of its `{% generation %}`
  blocks, in order ([] where the template has none)."""
  compiled = _compile(template)
  state = compiled.environment.state
  state.blocks, state.spans = [], []
  variables = _variables(messages, special_tokens, False, kwargs)

  def run() -> None:  # block by block: a generation block measures the text before it
    for block in compiled.generate(**variables):
      state.blocks.append(block)

  try:
    _rendering(run)
    return "".join(state.blocks), list(state.spans)
  finally:
    state.blocks = None


def _rendering(run: Callable[[], Any]) -> Any:
  """`run()`, a Jinja error while it renders raised as one line."""
  import jinja2

  try:
    return run()
  except jinja2.TemplateError as e:
    raise ValueError(f"chat template: {type(e).__name__}: {e}") from None


def assistant_spans(
  template: str,
  messages: Sequence[Mapping[str, Any]],
  special_tokens: Mapping[str, str],
  **kwargs: Any,
) -> tuple[str, list[Span]]:
  """The conversation's text (no generation prompt) and the character span of each
  assistant turn: the template's `{% generation %}` blocks where it has them, else from
  rendering prefixes (the module docstring). A turn whose content cannot be found in the
  rendered conversation is refused in one line."""
  text, spans = generation_spans(template, messages, special_tokens, **kwargs)
  if spans:
    return text, spans
  part = lambda n, prompt: render(template, messages[:n], special_tokens, prompt, **kwargs)  # noqa: E731
  for i, message in enumerate(messages):
    if message.get("role") != "assistant":
      continue
    before, through = part(i, True), part(i + 1, False)
    start = len(before) if text.startswith(before) else None
    end = len(through.rstrip()) if text.startswith(through) else None
    if start is None or end is None:  # rendered otherwise once other messages follow
      content = _content(template, messages, i, special_tokens, text, kwargs)
    if start is None:  # after the generation prompt before its content, else the whitespace
      prompt = before[len(part(i, False)) :]
      found = text.rfind(prompt, 0, content[0]) if prompt else -1
      start = found + len(prompt) if found >= 0 else len(text[: content[0]].rstrip())
    if end is None:  # at the end-of-turn text the template puts after an assistant content
      alone = _content(template, messages[: i + 1], i, special_tokens, through, kwargs)
      marker = through[alone[1] :].strip()
      found = text.find(marker, content[1]) if marker else content[1]
      if found < 0:
        raise ValueError(f"chat template: cannot find where assistant message {i} ends")
      end = found + len(marker)
    spans.append((start, max(start, end)))
  return text, spans


def _content(template, messages, i, special_tokens, text, kwargs) -> Span:
  """Where message i's content lies in `text`, its conversation rendered: the characters
  that change when that content is wrapped in invisible separators."""
  changed = [dict(m) for m in messages]
  changed[i]["content"] = f"\u2063{changed[i].get('content') or ''}\u2063"
  other = render(template, changed, special_tokens, False, **kwargs)
  start = len(os.path.commonprefix([text, other]))
  end = len(text) - len(os.path.commonprefix([text[::-1], other[::-1]]))
  if start == len(text) or end < start:
    raise ValueError(f"chat template: assistant message {i}'s content is not in the conversation")
  return start, end


def token_mask(
  length: int, spans: Sequence[Span], char_to_token: Callable[[int], Any]
) -> np.ndarray:
  """bool [L]: the tokens of `spans`, each from the token holding its first character to
  the one holding its last (`transformers`' `return_assistant_tokens_mask`)."""
  mask = np.zeros(length, bool)
  for start, end in spans:
    if end <= start:
      continue
    first, last = char_to_token(start), char_to_token(end - 1)
    if first is None:
      break
    mask[first : (last + 1 if last else length)] = True
  return mask


def encode(
  tokenizer: Any, messages: Sequence[Mapping[str, Any]], **kwargs: Any
) -> tuple[np.ndarray, np.ndarray]:
  """(ids int32 [L], assistant mask bool [L]) of a conversation under `tokenizer`'s chat
  template (a `convert.tokenizers.PretrainedTokenizer`): the ids `transformers`'
  `apply_chat_template(messages, tokenize=True)` gives, and the mask of the assistant
  turns (the module docstring)."""
  template, texts = tokenizer.chat_template()
  try:
    text, spans = assistant_spans(template, messages, texts, **kwargs)
  except ValueError as e:  # the template's own words (`raise_exception`) or Jinja's
    raise ValueError(f"{tokenizer.name}: {e}") from None
  ids, char_to_token = tokenizer.encode_chars(text)
  return ids, token_mask(len(ids), spans, char_to_token)
