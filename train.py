"""Trains a model: `python train.py --config configs/NAME.py[:arg] --workdir DIR [--config.a.b=v]`.

Rerunning the same command resumes from the latest checkpoint in DIR.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from transformer.cli import apply_process_settings, parse_flags, run_reporting_errors
from transformer.train.distributed import maybe_initialize
from transformer.train.loop import Hooks, train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "experiment config file", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics)")
flags.mark_flags_as_required(["config", "workdir"])

HOOKS = Hooks()  # the loop's hooks: none (the fault-injection tests run train.py with theirs)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:  # library INFO logs (orbax) only with -v 0
    logging.set_verbosity(logging.WARNING)
  apply_process_settings()  # before JAX starts: CPU allocator and XLA flags
  maybe_initialize()
  run_reporting_errors(train_and_evaluate, _CONFIG.value, _WORKDIR.value, HOOKS)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
