"""Trains a model: `python train.py --config configs/NAME.py[:arg] --workdir DIR [--config.a.b=v]`.

Rerunning the same command resumes from the latest checkpoint in DIR. The command is
`main` at the end of `transformer/train/loop.py`, the file to read (and to copy to fork
the loop); `transformer-train` is the same command installed.
"""

from absl import app

from transformer import cli
from transformer.train import loop

loop.define_flags()
HOOKS = loop.Hooks()  # the loop's hooks: none (the fault-injection tests run train.py with theirs)


def main(argv):
  loop.main(argv, HOOKS)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
