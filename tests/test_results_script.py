"""The run record train.py appends to WORKDIR/runs.jsonl, and docs/RESULTS.md generated
from it by scripts/results.py (a fake manifest pointing at a real tiny run)."""

from __future__ import annotations

import ast
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import fault_harness as fh
import jax
import pytest
from session_env import PATIENCE_S

from transformer.train.guard import run_record
from transformer.train.loop import Hooks

pytestmark = pytest.mark.one_worker  # the tiny train.py run runs once (conftest.py)

REPO = fh.REPO
TINY_FLAGS = ("--config.num_train_steps=4", "--config.model.num_layers=1")


def _cpu_family() -> str:
  """'family F, model M' from /proc/cpuinfo's first 'cpu family' and 'model' lines, read
  here by a regular expression ('' where there are none: no /proc, or not x86)."""
  try:
    with open("/proc/cpuinfo") as f:
      text = f.read()
  except OSError:
    return ""
  family = re.search(r"^cpu family\s*:\s*(\d+)$", text, re.M)
  model = re.search(r"^model\s*:\s*(\d+)$", text, re.M)
  return f"family {family[1]}, model {model[1]}" if family and model else ""


def _load_script():
  spec = importlib.util.spec_from_file_location(
    "results", os.path.join(REPO, "scripts", "results.py")
  )
  module = importlib.util.module_from_spec(spec)
  sys.modules["results"] = module  # dataclasses resolve their module by name
  spec.loader.exec_module(module)
  return module


results = _load_script()
inputs = sys.modules["results_inputs"]  # what the script reads: the manifest, the workdirs


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """A real 4-update `train.py` run of tests/tiny_lm_config.py (one layer), started from
  the repository root; its workdir and how long the subprocess took, measured outside."""
  workdir = str(tmp_path_factory.mktemp("results") / "tiny")
  cmd = [sys.executable, "train.py", f"--config={fh.TINY_CONFIG}", f"--workdir={workdir}"]
  began = time.time()
  out = subprocess.run(
    [*cmd, *TINY_FLAGS],
    env=fh.child_env(),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=PATIENCE_S,
  )
  took = time.time() - began
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  return {"workdir": workdir, "took": took, "began": began}


def _lines(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def test_train_py_appends_its_run_record(tiny_run):
  (record,) = _lines(os.path.join(tiny_run["workdir"], "runs.jsonl"))
  assert record["command"] == (
    f"python train.py --config=tests/tiny_lm_config.py --workdir={tiny_run['workdir']} "
    + " ".join(TINY_FLAGS)
  )
  assert record["status"] == "completed" and "error" not in record
  assert (record["resumed_from"], record["first_step"], record["last_step"]) == (0, 1, 4)
  # Wall time from the process start: within what the parent measured around it.
  assert record["wall_from"] == "process start (/proc/self/stat)"
  assert 1.0 < record["wall_seconds"] <= tiny_run["took"] + 0.1
  started = datetime.datetime.fromisoformat(record["started"].replace("Z", "+00:00"))
  ended = datetime.datetime.fromisoformat(record["ended"].replace("Z", "+00:00"))
  # The start comes from /proc (the boot time in whole seconds): up to 1 s early.
  assert tiny_run["began"] - 1.0 <= started.timestamp() <= tiny_run["began"] + tiny_run["took"]
  assert abs((ended - started).total_seconds() - record["wall_seconds"]) <= 1.0
  assert record["cpu_user_seconds"] > 0.5 and record["cpu_system_seconds"] >= 0.0
  assert set(record["isa"]) <= set(run_record.ISA_FLAGS) and record["cpu_count"] >= 1
  assert record["cpu_family"] == _cpu_family(), record["cpu_family"]
  assert len(record["load_start"]) == 3 and len(record["load_end"]) == 3
  assert record["versions"]["jax"] == jax.__version__ and record["versions"]["flax"]
  assert (record["platform"], record["device_count"], record["process_count"]) == ("cpu", 1, 1)
  # The final evaluation is the last eval line of metrics.jsonl.
  evals = [
    r for r in _lines(os.path.join(tiny_run["workdir"], "metrics.jsonl")) if r["split"] == "eval"
  ]
  assert evals[-1]["step"] == 4
  assert record["final_eval"]["loss"] == pytest.approx(evals[-1]["loss"], rel=1e-9)
  assert record["final_eval"]["accuracy"] == pytest.approx(evals[-1]["accuracy"], rel=1e-9)


def _manifest(tmp_path, workdir):
  text = f"""
[[recipe]]
name = "tiny"
title = "tiny LM"
config = "tests/tiny_lm_config.py"
workdir = "{workdir}"
args = {json.dumps(list(TINY_FLAGS))}
metrics = [
  {{ key = "loss", label = "validation loss", format = ".4f" }},
  {{ key = "accuracy", label = "accuracy", format = ".1%" }},
]
targets = [{{ metric = "loss", at_most = 100.0, why = "any" }}]

[[recipe]]
name = "absent"
title = "never run"
config = "configs/lm_shakespeare.py"
workdir = "{tmp_path / "no_such_run"}"
metrics = [{{ key = "loss", label = "loss", format = ".4f" }}]

[[notes]]
title = "Prose"
text = "A note without figures."
"""
  path = tmp_path / "manifest.toml"
  path.write_text(text)
  return path


def test_results_page_from_a_fake_manifest(tiny_run, tmp_path):
  workdir = tiny_run["workdir"]
  manifest = _manifest(tmp_path, workdir)
  out, images = tmp_path / "docs" / "RESULTS.md", tmp_path / "docs" / "images" / "results"
  argv = ["--manifest", str(manifest), "--out", str(out), "--images", str(images)]
  assert results.main(argv) == 0
  page = out.read_text()
  (record,) = _lines(os.path.join(workdir, "runs.jsonl"))
  final = [r for r in _lines(os.path.join(workdir, "metrics.jsonl")) if r["split"] == "eval"][-1]
  rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| **")}
  tiny = rows["**tiny**: tiny LM"]
  cells = [c.strip() for c in tiny.strip("|").split("|")]
  assert cells[1] == f"`python train.py --config tests/tiny_lm_config.py --workdir {workdir} " + (
    " ".join(TINY_FLAGS) + "`"
  )  # the same flags as recorded: no "recorded:" line
  assert cells[2] == f"{record['wall_seconds']:.0f} s"
  assert cells[3] == f"{record['cpu_user_seconds']:.0f} + {record['cpu_system_seconds']:.0f} s"
  assert cells[4] == results.isa_label(record["isa"])
  assert cells[5] == f"{record['load_start'][0]:.1f} → {record['load_end'][0]:.1f}"
  assert cells[6] == "1–4"
  assert (
    cells[7]
    == f"validation loss **{final['loss']:.4f}**; accuracy {final['accuracy']:.1%} (step 4)"
  )
  absent = [c.strip() for c in rows["**absent**: never run"].strip("|").split("|")]
  assert (
    absent[1]
    == f"`python train.py --config configs/lm_shakespeare.py --workdir {tmp_path / 'no_such_run'}`"
  )
  assert absent[2] == "not run" and absent[7] == "not run"
  assert f"- tiny (any): validation loss ≤ 100: **met**, {final['loss']:.4f}" in page
  assert "## Prose\n\nA note without figures.\n" in page
  assert "![tiny: tiny LM](images/results/tiny.png)" in page and "absent.png" not in page
  with open(os.path.join(workdir, "curves.png"), "rb") as f:
    assert (images / "tiny.png").read_bytes() == f.read()
  # The same runs give the same page: nothing changes, and --check agrees.
  assert results.generate(manifest, out, images) == []
  assert results.main([*argv, "--check"]) == 0
  out.write_text(page.replace("1–4", "1–5"))
  assert results.main([*argv, "--check"]) == 1 and "1–5" in out.read_text()


def test_run_record_phases_statuses_and_legs(tmp_path):
  """Steps come from the loop's phases; each invocation appends a line; the caller's own
  phase hook still sees every phase."""
  seen = []
  record = run_record.RunRecord(["train.py"], str(tmp_path))
  hooks = record.hooks(Hooks(phase=lambda name, step: seen.append((name, step))))
  for name, step in [("build", 0), ("restore", 0), ("train", 2), ("eval", 4), ("save", 4)]:
    hooks.phase(name, step)
  hooks.phase("train", 4)
  hooks.phase("finish", 6)
  assert len(seen) == 7
  first = record.finish(metrics={"loss": 1.5, "perplexity": float("inf")})
  assert (first["status"], first["resumed_from"], first["first_step"], first["last_step"]) == (
    "completed",
    2,
    3,
    6,
  )
  assert first["final_eval"] == {"loss": 1.5, "perplexity": None}
  assert record.finish(metrics={}) is None  # once per invocation

  rerun = run_record.RunRecord(["train.py"], str(tmp_path))  # a finished run, rerun
  for name, step in [("build", 0), ("train", 6), ("finish", 6)]:
    rerun.phase(name, step)
  assert rerun.finish(metrics={"loss": 1.5})["first_step"] is None

  preempted = run_record.RunRecord(["train.py"], str(tmp_path))
  for name, step in [("build", 0), ("train", 6), ("save", 8)]:
    preempted.phase(name, step)
  entry = preempted.finish(metrics={"preempted": 1.0, "step": 9.0})
  assert (entry["status"], entry["last_step"], entry["final_eval"]) == ("preempted", 9, {})

  failed = run_record.RunRecord(["train.py"], str(tmp_path))
  for name, step in [("build", 0), ("train", 9), ("eval", 10)]:
    failed.phase(name, step)
  entry = failed.finish(error=RuntimeError("step 11: non-finite loss\nmore"))
  assert (entry["status"], entry["error"]) == ("error", "RuntimeError: step 11: non-finite loss")
  assert (entry["first_step"], entry["last_step"]) == (10, 10)
  lines = _lines(tmp_path / "runs.jsonl")
  assert [line["status"] for line in lines] == ["completed", "completed", "preempted", "error"]


def test_run_record_is_never_fatal_and_skips_runs_that_did_not_start(tmp_path):
  unstarted = run_record.RunRecord(["train.py"], str(tmp_path / "typo"))
  assert unstarted.finish(error=ValueError("bad config")) is None  # before "build"
  assert not (tmp_path / "typo").exists()  # no workdir created for it
  blocker = tmp_path / "file"
  blocker.write_text("x")
  warnings = []
  record = run_record.RunRecord(["train.py"], str(blocker), warn=warnings.append)
  record.phase("build", 0)
  assert record.finish(metrics={}) is None
  assert len(warnings) == 1 and warnings[0].startswith(
    f"warning: run record not written to {blocker}"
  )


def test_command_line_is_readable(tmp_path):
  cwd = str(tmp_path)
  script = os.path.join(cwd, "train.py")
  argv = [
    script,
    f"--config={cwd}/configs/x.py:arg",
    "--workdir",
    f"{cwd}/runs/x",
    "--a=/elsewhere",
  ]
  assert run_record.command_line(argv, cwd) == (
    "python train.py --config=configs/x.py:arg --workdir runs/x --a=/elsewhere"
  )
  module = os.path.join(REPO, "transformer", "train_main.py")
  assert run_record.command_line([module, "--x=a b"], cwd) == (
    "python -m transformer.train_main '--x=a b'"
  )
  assert run_record.command_line(["/usr/bin/transformer-train", "--w=1"], cwd) == (
    "transformer-train --w=1"
  )


def test_pick_run_reports_the_last_completed_training_leg():
  legs = [
    {"status": "preempted", "first_step": 1, "last_step": 300},
    {"status": "completed", "first_step": 301, "last_step": 800, "wall_seconds": 40.0},
    {"status": "completed", "first_step": None, "last_step": None, "wall_seconds": 9.0},
  ]
  assert inputs.pick_run(legs) is legs[1]
  assert inputs.pick_run(legs[:1]) is legs[0] and inputs.pick_run([]) is None
  lines = [{"step": 4, "split": "eval", "loss": 2.0}, {"step": 8, "split": "eval", "loss": 1.0}]
  assert inputs.final_metrics([*lines, {"step": 9, "split": "train"}], "eval")["loss"] == 1.0
  assert (
    results.format_seconds(75.6) == "76 s" and results.format_seconds(828) == "828 s (13.8 min)"
  )
  assert results.isa_label(["avx2", "avx512f"]) == "AVX-512" and results.isa_label([]) == "unknown"


def _docstring_commands(config: str) -> str:
  with open(os.path.join(REPO, config), encoding="utf-8") as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ""
  return re.sub(r"\s+", " ", doc.replace("\\\n", " "))


def test_the_manifest_matches_the_configs():
  """Every recipe of scripts/results.toml names a config whose docstring gives the same
  command, so the page and the configs agree on how each run is made."""
  manifest = results.load_manifest(results.MANIFEST)
  assert manifest.recipes, "no recipes"
  for recipe in manifest.recipes:
    path = recipe.config.split(":")[0]  # a config argument (`:long`) follows the file
    assert os.path.isfile(os.path.join(REPO, path)), recipe.config
    assert recipe.command in _docstring_commands(path), (recipe.name, recipe.command)
    assert recipe.metrics, recipe.name
