"""Language-model samples: one at the end of training, and a continuation of each `eval.py
--prompt`."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from transformer import decode
from transformer.data.config import fail
from transformer.decode.sampling import Sampling
from transformer.decode.sliding import generate_sliding
from transformer.evaluators.base import Evaluator, at_least, strip_ids
from transformer.tasks.base import Run, Task

PAST_CONTEXT = ("cap", "slide")  # what LM sampling does with tokens beyond the context


@dataclasses.dataclass(frozen=True)
class SampleOptions:
  """config.evaluate.sample.FIELD (and eval.py's flags of the same names)."""

  prompts: tuple[str, ...] = ()  # texts to continue; training: at most one (none: a newline)
  max_new_tokens: int = 200  # tokens to sample (training: 0 = no sample at the end)
  temperature: float = 0.8  # sampling temperature (0 = greedy)
  top_k: int = 0  # keep the k most likely tokens (0 = all)
  top_p: float = 1.0  # nucleus mass (1 = all)
  num_samples: int = 1  # eval.py: samples per prompt
  past_context: str = "cap"  # eval.py: cap (new tokens fit the context) | slide (a window)

  def __post_init__(self):
    at_least("sample", self, 0, "max_new_tokens", "top_k", "temperature")
    at_least("sample", self, 1, "num_samples")
    if not 0 < self.top_p <= 1:
      fail("evaluate.sample.top_p", self.top_p, "must be in (0, 1]")
    if self.past_context not in PAST_CONTEXT:
      fail("evaluate.sample.past_context", self.past_context, f"must be one of {PAST_CONTEXT}")


@dataclasses.dataclass(frozen=True)
class Sample(Evaluator):
  """In training (`max_new_tokens` > 0), at the end: one continuation of its prompt (a
  newline when none is set), capped to the context, printed and logged as text 'sample'.
  From `eval.py`: `num_samples` continuations of each prompt (none given: nothing), new
  tokens capped to the context (with a note in 'notes') or, with past_context 'slide',
  through a sliding window."""

  name = "sample"
  Options = SampleOptions
  options: SampleOptions = SampleOptions()
  seed: int = 0  # seeds the sampling: a rerun draws the same samples

  @classmethod
  def unsupported(cls, task: Task) -> str | None:
    return None if task.prompts else "needs a task whose model continues text (a language model)"

  @classmethod
  def for_training(cls, task: Task, options: SampleOptions, seed: int) -> Sample:
    del task
    prompts = options.prompts or ("\n",)
    return cls(options=dataclasses.replace(options, prompts=prompts),
               at_end=options.max_new_tokens > 0, seed=seed)  # fmt: skip

  @classmethod
  def for_eval(cls, task: Task, options: SampleOptions) -> Sample:
    del task
    return cls(options=options)

  @classmethod
  def check_options(cls, options: SampleOptions) -> None:
    if len(options.prompts) > 1:
      fail("evaluate.sample.prompts", options.prompts, "training samples one prompt at the end")
    for name in ("num_samples", "past_context"):
      if getattr(options, name) != getattr(SampleOptions, name):
        fail(f"evaluate.sample.{name}", getattr(options, name), "is eval.py's, not training's")

  def sampling(self) -> Sampling:
    """The sampling these settings ask for (a fixed seed: a rerun draws the same samples)."""
    o = self.options
    return Sampling(jax.random.PRNGKey(self.seed), o.temperature, o.top_k, o.top_p)

  def check(self, model, tokenizer) -> None:
    o = self.options
    if o.prompts and not self.at_end:  # bad prompts fail before any evaluation work
      prompts, slide = list(o.prompts), o.past_context == "slide"
      new, _ = fit_to_context(tokenizer, prompts, o.max_new_tokens, model.max_len, o.past_context)
      check_prompts(tokenizer, prompts, new, None if slide else model.max_len)

  def run(self, run: Run) -> dict[str, Any]:
    if self.at_end:
      return self._final(run)
    o = self.options
    if not o.prompts:
      return {}
    prompts, tokenizer = list(o.prompts), run.info.tokenizer
    new, note = fit_to_context(tokenizer, prompts, o.max_new_tokens, run.model.config.max_len,
                               o.past_context)  # fmt: skip
    samples = sample_texts(
      run.model,
      run.params,
      tokenizer,
      prompts,
      sampling=self.sampling(),
      num_samples=o.num_samples,
      max_new_tokens=new,
      sliding=o.past_context == "slide",
    )
    return {"samples": samples, **({"notes": [note]} if note else {})}

  def compile_ahead(self, run: Run) -> None:
    """The end-of-training sample's decoding loop (nothing for `eval.py`'s samples)."""
    new = self._final_tokens(run) if self.at_end else None
    if isinstance(new, int):
      tokenizer = run.info.tokenizer
      rows = [tokenizer.encode(self.options.prompts[0])]
      options = _options(tokenizer, self.sampling(), new)
      decode.lower_generate(run.model, run.params, rows, **options).compile()

  def _final_tokens(self, run: Run) -> int | str:
    """The new tokens of the end-of-training sample, or why there is none."""
    (prompt,) = self.options.prompts
    prompt_len = len(run.info.tokenizer.encode(prompt))
    if not prompt_len:  # e.g. a pretrained SentencePiece vocabulary drops a lone newline
      return f"the prompt {prompt!r} encodes to no tokens; set evaluate.sample.prompts"
    room = run.model.config.max_len - prompt_len
    if room < 1:
      return f"the {prompt_len}-token prompt fills the context; shorten it"
    return min(self.options.max_new_tokens, room)

  def _final(self, run: Run) -> dict[str, str]:
    """The end-of-training sample, printed; a prompt the context cannot continue is
    reported and skipped rather than ending a finished run in an error."""
    (prompt,) = self.options.prompts
    max_new = self._final_tokens(run)
    if isinstance(max_new, str):
      print(f"--- no sample: {max_new} ---")
      return {}
    (sample,) = sample_texts(
      run.model,
      run.params,
      run.info.tokenizer,
      [prompt],
      sampling=self.sampling(),
      max_new_tokens=max_new,
    )
    print(f"--- sample ({max_new} tokens, temperature {self.options.temperature}) ---")
    print(prompt + sample["sample"])
    return {"sample": prompt + sample["sample"]}


def sample_texts(
  model: nn.Module,
  params: Any,
  tokenizer: Any,
  prompts: list[str],
  *,
  sampling: Sampling,
  num_samples: int = 1,
  max_new_tokens: int = 200,
  sliding: bool = False,
) -> list[dict[str, str]]:
  """`num_samples` continuations of each prompt (LMs) drawn with `sampling`. Raises
  ValueError for bad prompts.

  `sliding`: through a window of the model's last `max_len` tokens (`decode.sliding`), so
  prompt + new tokens may exceed the context; else cached decoding within the context.
  Each sample says which (`generation`: 'cached' or 'sliding window of W tokens').
  """
  max_len = model.config.max_len
  rows = check_prompts(tokenizer, prompts, max_new_tokens, None if sliding else max_len)
  rows = [r for r in rows for _ in range(num_samples)]
  texts = [p for p in prompts for _ in range(num_samples)]
  generate = generate_sliding if sliding else decode.generate
  out = generate(model, params, rows, **_options(tokenizer, sampling, max_new_tokens))
  how = f"sliding window of {max_len} tokens" if sliding else "cached"
  tokens = [strip_ids(t, tokenizer.eos_id, pad_id=None) for t in np.asarray(out.tokens)]
  return [
    {"prompt": p, "sample": tokenizer.decode(t), "generation": how}
    for p, t in zip(texts, tokens, strict=True)
  ]


def _options(tokenizer: Any, sampling: Sampling, max_new_tokens: int) -> dict[str, Any]:
  """The decoding options of a sample (`decode.generate`'s keywords)."""
  return dict(max_new_tokens=max_new_tokens, method="sample", sampling=sampling,
              eos_id=tokenizer.eos_id)  # fmt: skip


def fit_to_context(
  tokenizer: Any, prompts: list[str], max_new_tokens: int, max_len: int, past_context: str
) -> tuple[int, str | None]:
  """(new tokens to sample, a one-line note or None) for `past_context`: 'cap' fits them
  into the model's context after the longest prompt (noting a cut), 'slide' keeps them
  all (a sliding window). ValueError for an unknown mode or a prompt that fills the
  context under 'cap'."""
  if past_context not in PAST_CONTEXT:
    raise ValueError(f"past_context={past_context!r}: expected one of {', '.join(PAST_CONTEXT)}")
  if past_context == "slide" or max_new_tokens < 1:
    return max_new_tokens, None
  longest = max((len(tokenizer.encode(p)) for p in prompts), default=0)
  room = max_len - longest
  if room < 1:
    raise ValueError(
      f"a {longest}-token prompt fills the model's context (max_len={max_len}): shorten it, "
      "or use --past_context=slide to generate through a sliding window"
    )
  if max_new_tokens <= room:
    return max_new_tokens, None
  return room, (
    f"note: {max_new_tokens} new tokens capped to {room}: the model's context is "
    f"max_len={max_len} tokens with a {longest}-token prompt "
    "(--past_context=slide generates past it through a sliding window)"
  )


def check_prompts(
  tokenizer: Any, prompts: list[str], max_new_tokens: int, max_len: int | None
) -> list:
  """Token ids of each prompt; ValueError for an empty prompt, characters the vocabulary
  lacks, or a length the model cannot hold (`max_len` None: no length limit)."""
  rows = []
  for prompt in prompts:
    if not prompt:
      raise ValueError("--prompt is empty: give at least one character to continue")
    unknown = tokenizer.unknown_chars(prompt) if hasattr(tokenizer, "unknown_chars") else {}
    if unknown:
      chars = "".join(sorted(unknown))
      raise ValueError(f"prompt {prompt!r} has characters outside the vocabulary: {chars!r}")
    rows.append(tokenizer.encode(prompt))
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
  longest = max(len(r) for r in rows)
  if max_len is not None and longest + max_new_tokens > max_len:
    raise ValueError(
      f"{max_new_tokens} new tokens after a {longest}-token prompt exceed the model's "
      f"max_len={max_len}; ask for at most {max_len - longest}"
    )
  return rows
