"""`train.py` with the loop's phases on stderr: `phase NAME STEP` lines for the fault harness.

  python tests/traced_train.py --config ... --workdir ...   (the flags of train.py)

It installs a phase hook (`transformer.train.loop.Hooks`) and runs train.py's `main`, so
the fault-injection tests can kill a run at a chosen moment (tests/fault_harness.py).
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app  # noqa: E402

import train  # noqa: E402  (train.py at the repository root)
from transformer.cli import parse_flags  # noqa: E402
from transformer.train.loop import Hooks  # noqa: E402


def print_phase(name: str, step: int) -> None:
  print(f"phase {name} {step}", file=sys.stderr, flush=True)


if __name__ == "__main__":
  train.HOOKS = Hooks(phase=print_phase)
  app.run(train.main, flags_parser=parse_flags)
