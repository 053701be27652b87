"""`transformer-eval` (`python -m transformer.eval_main`): eval.py as an installed command.

  transformer-eval --workdir DIR [--checkpoint STEP] [--eval_batches N]
  transformer-eval --workdir DIR --ema                         # the EMA weights (ema_decay)
  transformer-eval --workdir DIR --merge_lora --prompt "ROMEO:"  # adapters merged (lora_rank)
  transformer-eval --workdir DIR --prompt "ROMEO:" --num_samples 3 --temperature 0.8 --top_k 40
  transformer-eval --workdir DIR --prompt "ROMEO:" --max_new_tokens 500 --past_context slide
  transformer-eval --workdir DIR --bleu_method greedy          # translation runs
  transformer-eval --workdir DIR --analyze [--prompt TEXT]     # attention statistics, heatmaps

LMs: loss and perplexity (and samples for each --prompt: new tokens are capped to the
model's context, with a note, unless --past_context=slide generates past it through a
sliding window of the last max_len tokens); translation: corpus BLEU with
sacrebleu (beam search by default); classifiers and ViT: accuracy and a confusion matrix
(table, and DIR/confusion_step_<STEP>.png). Everything goes to DIR/eval_step_<STEP>.json.
"""

from absl import app, flags, logging

from transformer.cli import apply_process_settings, errors_in_one_line, parse_flags
from transformer.eval.evaluate import EVAL_OPTIONS, evaluate
from transformer.evaluators.bleu import BleuOptions
from transformer.evaluators.sample import SampleOptions

_SAMPLE, _BLEU = EVAL_OPTIONS["sample"], EVAL_OPTIONS["bleu"]  # the flags' defaults

_WORKDIR = flags.DEFINE_string("workdir", None, "training run directory")
_CHECKPOINT = flags.DEFINE_integer("checkpoint", None, "step to evaluate (default: latest)")
_EVAL_BATCHES = flags.DEFINE_integer("eval_batches", None, "batches (default: as in training)")
_PROMPT = flags.DEFINE_multi_string("prompt", [], "LM: text to continue (repeatable)")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", _SAMPLE.num_samples, "LM: samples per prompt")
_CHAT = flags.DEFINE_bool("chat", False, "LM: each --prompt as a user turn of the chat template")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", _SAMPLE.max_new_tokens, "LM: tokens to sample")
_PAST_CONTEXT = flags.DEFINE_enum(
  "past_context", _SAMPLE.past_context, ["cap", "slide"],
  "LM: new tokens past the model's context: cap them (a note says so) or slide a window",
)  # fmt: skip
_TEMPERATURE = flags.DEFINE_float(
  "temperature", _SAMPLE.temperature, "LM: sampling temperature (0 = greedy)"
)
_TOP_K = flags.DEFINE_integer("top_k", _SAMPLE.top_k, "LM: keep the k most likely tokens (0 = all)")
_TOP_P = flags.DEFINE_float("top_p", _SAMPLE.top_p, "LM: nucleus mass (1 = all)")
_BLEU_METHOD = flags.DEFINE_enum("bleu_method", "beam", ["beam", "greedy"], "translation decoding")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", _BLEU.beam_size, "translation beam size")
_EMA = flags.DEFINE_bool("ema", False, "evaluate the EMA of the parameters (runs with ema_decay)")
_MERGE_LORA = flags.DEFINE_bool(
  "merge_lora", False, "decode with the LoRA adapters merged into the weights (lora_rank > 0)"
)
_ANALYZE = flags.DEFINE_bool("analyze", False, "attention statistics + heatmaps (first --prompt)")
flags.mark_flag_as_required("workdir")


def _run():
  if _ANALYZE.value:  # transformer/research/analysis.py; see docs/RESEARCH.md
    from transformer.research import analysis

    text = _PROMPT.value[0] if _PROMPT.value else None
    print(analysis.analyze(_WORKDIR.value, _CHECKPOINT.value, text=text)["markdown"])
    return
  sample = SampleOptions(
    prompts=tuple(_PROMPT.value), num_samples=_NUM_SAMPLES.value, max_new_tokens=_MAX_NEW.value,
    temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value,
    past_context=_PAST_CONTEXT.value,
  )  # fmt: skip
  beam_size = _BEAM_SIZE.value if _BLEU_METHOD.value == "beam" else 1
  options = {"sample": sample, "bleu": BleuOptions(beam_size=beam_size)}
  result = evaluate(_WORKDIR.value, _CHECKPOINT.value, _EVAL_BATCHES.value, options, _EMA.value,
                    _MERGE_LORA.value, _CHAT.value)  # fmt: skip
  scalars = {
    k: v for k, v in result.items() if isinstance(v, (int, float, str)) and k != "confusion_table"
  }
  print(
    " | ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in scalars.items())
  )
  for note in result.get("notes", []):
    print(note)
  for sample in result.get("samples", []):
    how = sample.get("generation", "cached")
    label = "" if how == "cached" else f" ({how})"
    print(f"--- {sample['prompt']!r}{label} ---\n{sample['prompt']}{sample['sample']}")
  for example in result.get("examples", []):
    print(f"hyp: {example['hypothesis']}\nref: {example['reference']}")
  if result.get("confusion_table"):
    print(result["confusion_table"])


def main(argv: list[str]) -> None:
  """Evaluates `--workdir` (see the module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  apply_process_settings()  # before JAX starts: CPU allocator and XLA flags
  with errors_in_one_line():
    _run()


def run() -> None:
  """The console entry point."""
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
