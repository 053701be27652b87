"""Records the golden training curves that tests/test_golden_curves.py compares against.

  python scripts/record_golden.py                            # every recipe in GOLDEN
  python scripts/record_golden.py --config lm_shakespeare    # only this one (repeatable)
  python scripts/record_golden.py --out DIR                  # write DIR/NAME.json instead

Each recipe of `GOLDEN` runs as `train.py` runs it on a CPU host (one CPU device, the
CPU settings of `process_settings`), at its real model size, on its real data, with its
real optimizer and learning-rate schedule, for its first N updates only: the schedule's
length (`schedule.total_steps`) stays the recipe's `num_train_steps`, so update n has the
learning rate it has in the full run, and the run just stops after update N. Every update
is logged, nothing is evaluated before the end, and the end evaluates `EVAL_BATCHES`
batches of the evaluation split. The file tests/golden/NAME.json then holds the N training
losses and learning rates, that evaluation loss and what produced them (the config, the
overrides, the jax / jaxlib / flax / optax versions, the CPU and its vector ISA flags, the
XLA flags, the date). The JSON is deterministic: sorted keys, two-space indent, every
number written with 9 significant digits (a float32 exactly), a list of numbers on one
line; recording again on the same machine and versions changes only the date.

Recording is a deliberate act: a change that moves a curve must say why in its commit
message (docs/GOLDEN.md). The test runs this script with `--out` into a temporary folder
and compares the files, so both always run the same thing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from transformer import process_settings  # imports no JAX
from transformer.train.machine import cpuinfo_fields  # nor this

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO / "tests" / "golden"
# Recipe (configs/NAME.py) -> training updates recorded. The default run and one recipe
# of each other family, sized so that all four run in well under two minutes on 2 cores
# (compilation and the data preparation dominate; see docs/GOLDEN.md for the timings).
GOLDEN = {
  "lm_shakespeare": 30,  # decoder: the default run (char LM, tiny shakespeare)
  "classify_testament": 20,  # encoder: OT/NT verse classification (from scratch)
  "translate_en_es": 12,  # encoder-decoder: en -> es verses (0.5-0.8 s per update here)
  "vit_fashion_mnist": 40,  # ViT: the shipped Fashion-MNIST IDX files (200-update warmup)
}
EVAL_BATCHES = 1  # batches of the evaluation split evaluated once, after update N
ISA_FLAGS = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*)$")
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "grain", "sentencepiece")


def one_cpu_device() -> None:
  """Before JAX starts: one CPU device, as `train.py` has on a CPU host, whatever device
  count the caller forced (tests/conftest.py fakes eight). The caller's other XLA flags
  stay: `XLA_FLAGS=--xla_cpu_max_isa=AVX2` records what another instruction set gives."""
  os.environ["JAX_PLATFORMS"] = "cpu"
  flags = os.environ.get("XLA_FLAGS", "")
  flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", flags)
  os.environ["XLA_FLAGS"] = " ".join(flags.split())


def load_config(name: str):
  """configs/NAME.py's `get_config()` (its default argument), as `train.py` loads it."""
  spec = importlib.util.spec_from_file_location(f"configs_{name}", REPO / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def golden_config(name: str, steps: int):
  """The recipe, stopped after `steps` updates of its own schedule; and the overrides."""
  config = load_config(name)
  overrides = {
    # The schedule keeps the recipe's length: update n has its full-run learning rate.
    "schedule.total_steps": config.schedule.total_steps or config.num_train_steps,
    "num_train_steps": steps,
    "log_every": 1,  # every update's loss
    "eval_every": 0,  # no evaluation before the end
    "eval_batches": EVAL_BATCHES,  # the end: a fixed slice of the evaluation split
    "checkpoint_every": steps,  # no checkpoint before the end (the end always writes one)
    "evaluate.sample.max_new_tokens": 0,  # LM: no sample after training (not a loss)
    "evaluate.bleu.every": 0,  # seq2seq: no BLEU decoding (minutes on a CPU)
  }
  config.update_from_flattened_dict(overrides)
  return config, overrides


def _number(x: float | None) -> float | None:
  """9 significant digits: a float32 exactly, written the same on every machine."""
  return None if x is None else float(f"{x:.9g}")


def cpu_description() -> dict:
  """The CPU's model name and the vector-ISA flags that decide XLA:CPU's kernels (every
  flag `ISA_FLAGS` matches, not only those of `transformer.train.machine.ISA_FLAGS`)."""
  fields = cpuinfo_fields()
  model = fields.get("model name") or platform.processor() or platform.machine()
  flags = sorted(f for f in fields.get("flags", "").split() if ISA_FLAGS.match(f))
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"model": model, "isa_flags": flags, "cores": cores}


def record(name: str, steps: int, workdir: str) -> tuple[dict, float]:
  """Trains `name` for `steps` updates in `workdir`: the golden record of that run, and
  the seconds it took (build, compilation, the updates and the evaluation; printed, not
  recorded, so that recording again on the same machine changes only the date)."""
  from transformer.train import loop as train_lib

  config, overrides = golden_config(name, steps)
  start = time.perf_counter()
  final = train_lib.train_and_evaluate(config, workdir)
  seconds = time.perf_counter() - start
  lines = Path(workdir, "metrics.jsonl").read_text().splitlines()
  train = {}
  for line in lines:
    row = json.loads(line)
    if row["split"] == "train":
      train[row["step"]] = row
  if sorted(train) != list(range(1, steps + 1)):
    raise RuntimeError(f"{name}: logged updates {sorted(train)}, expected 1..{steps}")
  return {
    "config": f"configs/{name}.py",
    "steps": steps,
    "overrides": overrides,
    "train_loss": [_number(train[s]["loss"]) for s in range(1, steps + 1)],
    "learning_rate": [_number(train[s]["learning_rate"]) for s in range(1, steps + 1)],
    "eval_loss": _number(final["loss"]),
    "eval_batches": EVAL_BATCHES,
    "recorded": {
      "date": datetime.date.today().isoformat(),
      "versions": {p: importlib.metadata.version(p) for p in PACKAGES},
      "python": platform.python_version(),
      "cpu": cpu_description(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
    },
  }, seconds


def dumps(record: dict) -> str:
  """Sorted keys, two-space indent; a list of numbers on one line (diffs stay per key)."""
  text = json.dumps(record, indent=2, sort_keys=True)
  # json.dumps puts one list item per line: join lists of numbers onto one line.
  number = r"-?\d[\d.eE+-]*|null"
  items = re.compile(rf"\[\s*((?:(?:{number}),\s*)*(?:{number}))\s*\]")
  return items.sub(lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]", text) + "\n"


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  every = ", ".join(GOLDEN)
  parser.add_argument(
    "--config", action="append", choices=sorted(GOLDEN), metavar="NAME",
    help=f"recipe to record (repeatable; default: every one of {every})",
  )  # fmt: skip
  parser.add_argument("--out", default=str(GOLDEN_DIR), help="folder of NAME.json files")
  parser.add_argument("--workdir", default="", help="run folders go here (default: a temp one)")
  args = parser.parse_args(argv)
  one_cpu_device()
  process_settings.apply("auto")  # as train.py: CPU allocator and XLA vector width
  from absl import logging

  logging.set_verbosity(logging.WARNING)  # as train.py: no orbax INFO lines
  os.chdir(REPO)  # the recipes name their data relative to the checkout
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  root = args.workdir or tempfile.mkdtemp(prefix="golden_")
  try:
    for name in args.config or list(GOLDEN):
      workdir = os.path.join(root, name)
      if os.path.exists(workdir):
        raise SystemExit(f"error: {workdir} exists: the run must start from nothing")
      result, seconds = record(name, GOLDEN[name], workdir)
      (out / f"{name}.json").write_text(dumps(result))
      print(f"golden: wrote {out / f'{name}.json'} ({seconds:.1f} s)")
  finally:
    if not args.workdir:
      shutil.rmtree(root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
