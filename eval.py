"""Evaluates a training workdir: `python eval.py --workdir DIR [--checkpoint STEP]`.

Prints the metrics and writes them to DIR/eval_step_<STEP>.json.
"""

from absl import app, flags, logging

from transformer import eval_lib
from transformer.cli import parse_flags, run_reporting_errors

_WORKDIR = flags.DEFINE_string("workdir", None, "training run directory")
_CHECKPOINT = flags.DEFINE_integer("checkpoint", None, "step to evaluate (default: latest)")
_EVAL_BATCHES = flags.DEFINE_integer("eval_batches", None, "batches (default: as in training)")
flags.mark_flag_as_required("workdir")


def _run():
  result = eval_lib.evaluate(_WORKDIR.value, _CHECKPOINT.value, _EVAL_BATCHES.value)
  print(" | ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  run_reporting_errors(_run)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
