"""Next-token prediction for decoder-only models (GPT): loss, perplexity and text samples.

Batches [B, T] (int32 unless noted): inputs, targets (the next tokens), weights f32,
segment_ids (1, 2, ... per packed example, 0 = padding), positions (restart per example).
From a token stream (source 'text', or `data.windows`): windows of T + 1 tokens (nanoGPT);
from records: [BOS] text [EOS] examples, packed or padded into rows.
"""

from __future__ import annotations

import dataclasses

import grain
import jax

from transformer.data import pipeline
from transformer.data.spec import F32, I32, DataContext, DataSpec
from transformer.decode.sampling import Sampling
from transformer.tasks import evals
from transformer.tasks.base import EvalOptions, Extras, Run, Task

KEYS = ("inputs", "targets", "weights", "segment_ids", "positions")


def token_shapes(keys: tuple[str, ...]):
  """Shapes of batches whose every key is [B, T] (weights float32, the rest int32)."""

  def shapes(rows: int, s: int, t: int, image_shape) -> dict:
    del t, image_shape
    return {k: ((rows, s), F32 if k == "weights" else I32) for k in keys}

  return shapes


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  return pipeline.lm_dataset(
    c.source(train),
    c.tok,
    batch_size=rows,
    train=train,
    windows=bool(c.streams),
    packed=c.cfg.packing,
    text_key=c.text_key,
    **c.text_common(),
  )


@dataclasses.dataclass(frozen=True)
class LanguageModeling(Task):
  name = "lm"
  families = ("decoder",)
  prompts = True

  def data_spec(self) -> DataSpec:
    return DataSpec(
      build=_build,
      shapes=token_shapes(KEYS),
      window=lambda s, t: s,
      packing_key="segment_ids",
      row_budget=lambda counts, s, t: [(counts[0] + 2, s + 1)],  # BOS + EOS; T + 1 tokens
    )

  def forward(self, model, batch, deterministic):
    logits = model(
      batch["inputs"],
      positions=batch["positions"],
      segment_ids=batch["segment_ids"],
      deterministic=deterministic,
    )  # [B, T, V]
    return logits, batch["targets"], batch["weights"]

  def init_args(self, batch):
    return (batch["inputs"],), {
      "positions": batch["positions"],
      "segment_ids": batch["segment_ids"],
    }

  def after_training(self, run: Run, extras: Extras) -> dict[str, str] | None:
    """Prints a sample (and returns it, tag 'sample', for TensorBoard and W&B)."""
    if not extras.sample_tokens:
      return None
    prompt = extras.sample_prompt or "\n"
    prompt_len = len(run.info.tokenizer.encode(prompt))
    if not prompt_len:  # e.g. a pretrained SentencePiece vocabulary drops a lone newline
      print(f"--- no sample: the prompt {prompt!r} encodes to no tokens; set sample_prompt ---")
      return None
    room = run.model.config.max_len - prompt_len
    if room < 1:
      print(f"--- no sample: the {prompt_len}-token prompt fills the context; shorten it ---")
      return None
    max_new = min(extras.sample_tokens, room)
    (sample,) = evals.sample_texts(
      run.model,
      run.params,
      run.info.tokenizer,
      [prompt],
      sampling=Sampling(jax.random.PRNGKey(extras.seed), extras.sample_temperature),
      max_new_tokens=max_new,
    )
    print(f"--- sample ({max_new} tokens, temperature {extras.sample_temperature}) ---")
    print(prompt + sample["sample"])
    return {"sample": prompt + sample["sample"]}

  def check_options(self, options: EvalOptions, run_model, tokenizer) -> None:
    if options.prompts:  # bad prompts fail before any evaluation work
      prompts = list(options.prompts)
      new, _ = evals.fit_to_context(tokenizer, prompts, options.max_new_tokens,
                                    run_model.max_len, options.past_context)  # fmt: skip
      slide = options.past_context == "slide"
      evals.check_prompts(tokenizer, prompts, new, None if slide else run_model.max_len)

  def evaluate(self, run: Run, options: EvalOptions) -> dict:
    """Samples for `options.prompts`: new tokens capped to the context (with a note in
    'notes') or, with past_context 'slide', through a sliding window."""
    if not options.prompts:
      return {}
    prompts = list(options.prompts)
    new, note = evals.fit_to_context(run.info.tokenizer, prompts, options.max_new_tokens,
                                     run.model.config.max_len, options.past_context)  # fmt: skip
    samples = evals.sample_texts(
      run.model,
      run.params,
      run.info.tokenizer,
      prompts,
      sampling=options.sampling(),
      num_samples=options.num_samples,
      max_new_tokens=new,
      sliding=options.past_context == "slide",
    )
    return {"samples": samples, **({"notes": [note]} if note else {})}

  def text_batch(self, tokenizer, text: str, max_len: int):
    return evals.text_batch(tokenizer, text, max_len)
