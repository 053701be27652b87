"""Knowledge distillation on tiny shakespeare: a character GPT half the default model's
width (64 wide, 4 layers) learns from the default model as its frozen teacher (128
wide, twice the student's width), trained first with `make train` (runs/lm_shakespeare).

  python train.py --config configs/distill_shakespeare.py --workdir runs/distill
  python train.py --config configs/distill_shakespeare.py:alone --workdir runs/student

`:alone` is the same student, data, schedule and steps on the labels only (task `lm`), the
comparison arm. Everything but the width and the objective is configs/lm_shakespeare.py.
Results over 3 seeds: docs/RESEARCH.md ("Knowledge distillation").
"""

from transformer.train.config_files import beside
from transformer.train.experiment import task_block


def get_config(arg=None):
  config = beside(__file__, "lm_shakespeare")
  m = config.model
  m.d_model = 64  # half the teacher's width, with its depth and head count
  m.d_ff = 256
  if arg == "alone":
    return config
  if arg is not None:
    raise ValueError(f"configs/distill_shakespeare.py: unknown argument {arg!r} (use alone)")
  d = config.data
  d.kind = "distill"
  config.task = task_block("distill")
  t = config.task
  t.teacher = "runs/lm_shakespeare"  # make train's workdir
  t.temperature = 2.0  # Hinton et al. 2015 use 1 to 20; 2 to 4 is usual for LMs
  t.alpha = 0.5  # half soft targets, half labels
  return config
