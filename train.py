"""Trains a model: `python train.py --config configs/NAME.py[:arg] --workdir DIR [--config.a.b=v]`.

Rerunning the same command resumes from the latest checkpoint in DIR. The command itself is
`transformer/train_main.py` (installed as `transformer-train`).
"""

from absl import app

from transformer import train_main
from transformer.train.loop import Hooks

HOOKS = Hooks()  # the loop's hooks: none (the fault-injection tests run train.py with theirs)


def main(argv):
  train_main.main(argv, HOOKS)


if __name__ == "__main__":
  app.run(main, flags_parser=train_main.parse_flags)
