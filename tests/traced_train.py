"""`train.py` with the loop's phases on stderr: `phase NAME STEP` lines for the fault harness.

  python tests/traced_train.py --config ... --workdir ...   (the flags of train.py)

It installs a phase hook (`transformer.train.loop.Hooks`) and runs train.py's `main`, so
the fault-injection tests can kill a run at a chosen moment (tests/fault_harness.py).
`main(phase)` is the same with another hook: the scripts of tests/fault_harness.py and
tests/test_multihost_resume.py, which can also hold a run at a phase.
"""

import os
import sys
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def print_phase(name: str, step: int) -> None:
  print(f"phase {name} {step}", file=sys.stderr, flush=True)


def main(phase: Callable[[str, int], None] = print_phase) -> None:
  """Runs train.py's `main` on this process's flags with `phase` as the loop's hook."""
  from absl import app
  from session_env import share_compilations_between_processes

  import train  # train.py at the repository root
  from transformer.cli import parse_flags
  from transformer.train.loop import Hooks

  share_compilations_between_processes()
  train.HOOKS = Hooks(phase=phase)
  app.run(train.main, flags_parser=parse_flags)


if __name__ == "__main__":
  main()
