"""What the experiments of `low_label.py` and `span_transfer.py` share: a training run in
its own process (wall and CPU seconds), a pretrained run trained once and reused, a run's
evaluations, the machine they ran on, and mean ± standard deviation over seeds.
"""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from transformer.data.files import read_jsonl
from transformer.train.machine import cpu_info, load_average


def train_process(config: str, workdir: Path, overrides: list[str]) -> tuple[float, float]:
  """One training process; output to `workdir/train.log`. Returns (wall, CPU) seconds."""
  workdir.mkdir(parents=True, exist_ok=True)
  command = [sys.executable, "-m", "transformer.train_main", f"--config={config}"]
  command += [f"--workdir={workdir}", *overrides]
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  with open(workdir / "train.log", "a", encoding="utf-8") as log:
    log.write("$ " + " ".join(command) + "\n")
    log.flush()
    code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if code:
    tail = (workdir / "train.log").read_text(encoding="utf-8").strip().splitlines()[-1:]
    raise RuntimeError(f"{workdir}: training failed (exit {code}): {tail[0] if tail else ''}")
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return wall, cpu


def has_checkpoint(workdir: Path) -> bool:
  folder = workdir / "checkpoints"
  return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def pretrain(workdir: Path, steps: int, config: str) -> Path:
  """`workdir` as it is if it holds a finished (or foreign) run, else trains `config`
  there (`steps` updates; 0 = the recipe's)."""
  started_here = (workdir / "train.log").exists() and not (workdir / "done").exists()
  if has_checkpoint(workdir) and not started_here:
    print(f"pretrained model: {workdir} (used as it is)", flush=True)
    return workdir
  print(f"pretraining {config} in {workdir} ...", flush=True)
  overrides = [f"--config.num_train_steps={steps}"] if steps else []
  wall, cpu = train_process(config, workdir, overrides)
  (workdir / "done").write_text(json.dumps({"seconds": wall, "cpu_seconds": cpu}) + "\n")
  print(f"pretraining done in {wall:.0f} s ({cpu:.0f} s CPU)", flush=True)
  return workdir


def read_evaluations(workdir: Path) -> list[dict]:
  """The `eval` records of a run's metrics.jsonl, by step (a resumed run's last wins)."""
  by_step: dict[int, dict] = {}
  path = workdir / "metrics.jsonl"
  if not path.is_file():
    raise FileNotFoundError(f"{path}: no metrics log (did the run start?)")
  for record in read_jsonl(path):
    if record.get("split") == "eval":
      by_step[int(record["step"])] = record
  return [by_step[s] for s in sorted(by_step)]


def mean_std(values: list[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (ddof 1; 0 for a single value)."""
  a = np.asarray(values, dtype=np.float64)
  return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def machine() -> dict:
  """CPU model (with its family and model numbers), core count, vector ISA flags and the
  1 / 5 / 15-minute load averages."""
  info = cpu_info()
  cpu = info["cpu_model"] or platform.processor()
  return {
    "cpu": f"{cpu} ({info['cpu_family']})" if info["cpu_family"] else cpu,
    "cores": info["cpu_count"],
    "isa": info["isa"],
    "load_average": load_average(),
  }
