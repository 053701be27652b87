"""The many-hosts commands of docs/SCALING.md, run as written on two local CPU processes.

The fenced bash blocks of the section "Many hosts" are parsed from the document; only the
placeholders (`HOST0:PORT`, `N`, `I`), the `--config` value (tests/tiny_lm_config.py) and
the `--workdir` value (a temporary folder) are replaced, and tiny `--config.` overrides are
appended (2 steps; `mesh.fsdp=2` where a command sets `mesh.fsdp`). Each process has one
XLA CPU device; coordinators listen on 127.0.0.1 (JAX_COORDINATOR_BIND_ADDRESS).

- Slurm: what follows `srun` runs as the two tasks of a one-node step, with the variables
  Slurm sets for it; JAX's Slurm detection must pick the coordinator (from the job id).
- Explicit: the block runs under bash with the placeholders filled in.
- Cloud TPU: the `--command` string of `gcloud ... ssh --worker=all` runs under bash from a
  folder whose `transformer` is this checkout, with the explicit variables standing in for
  the slice's metadata (JAX's TPU detection needs a TPU VM), and once with no cluster at
  all, which must end in one `error:` line.

Each two-process run must exit 0 on both processes, report `process I of 2`, log step 2
and commit checkpoint 2. Incomplete explicit variables must each end in one `error:` line.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import runpy
import shlex
import socket
import subprocess
import sys
import textwrap
import time

import fault_harness as fh
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "SCALING.md")
TINY_CONFIG = os.path.join(REPO, "tests", "tiny_lm_config.py")
EXTRA = (
  "--config.num_train_steps=2",
  "--config.schedule.warmup_steps=1",
  "--config.eval_batches=1",
)
# Variables of the launching machine that would change what the commands detect.
FOREIGN = ("TRANSFORMER_", "SLURM", "JAX_COORDINATOR", "JAX_LOCAL_DEVICE_IDS", "OMPI_", "PMI")
FOREIGN_NAMES = ("KUBERNETES_SERVICE_HOST", "JAX_PORT", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


_SINGLE_SLICE = {"context": 1, "dcn_data": 1, "dcn_fsdp": 1}  # the mesh fields not set here


def _blocks() -> dict[str, str]:
  """The section's fenced bash blocks by kind, backslash-newlines removed (as bash does)."""
  text = open(DOC).read()
  start = text.index("\n## Many hosts\n")
  end = re.compile(r"\n##+ ").search(text, start + 1).start()
  found = re.findall(r"\n( *)```bash\n(.*?)\n *```", text[start:end], re.S)
  blocks = {}
  for indent, body in found:
    code = textwrap.dedent(indent + body).replace("\\\n", "")
    kind = "tpu" if "gcloud compute tpus" in code else "slurm" if "\nsrun " in code else "explicit"
    assert kind not in blocks, f"two {kind} blocks in the section"
    blocks[kind] = code
  assert sorted(blocks) == ["explicit", "slurm", "tpu"], blocks
  return blocks


def _tiny(command: str, workdir: str, data_dir: str) -> str:
  """`command` with the config and workdir replaced and the tiny overrides appended."""
  command, n = re.subn(r"--config[ =]\S+", f"--config {shlex.quote(TINY_CONFIG)}", command)
  assert n == 1, command
  command, n = re.subn(r"--workdir[ =]\S+", f"--workdir {shlex.quote(workdir)}", command)
  assert n == 1, command
  extra = [*EXTRA, f"--config.data.data_dir={data_dir}"]
  if "--config.mesh.fsdp=" in command:
    extra.append("--config.mesh.fsdp=2")  # the doc's 8 devices are 2 processes here
  return f"{command.rstrip()} {shlex.join(extra)}"


def _free_port(low: int = 20000, high: int = 60000) -> int:
  for _ in range(200):
    port = random.randint(low, high)
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
    return port
  raise RuntimeError(f"no free port in {low}..{high}")


def _run_all(commands: list[tuple[list[str], dict, str]]) -> list[tuple[int, str]]:
  """Starts every (argv, env, cwd) at once; (status, output) of each. Always killed."""
  procs = []
  try:
    for argv, env, cwd in commands:
      procs.append(
        subprocess.Popen(
          argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
      )
    deadline = time.monotonic() + fh.PATIENCE_S  # a run takes about 15 s on 2 idle cores
    results = []
    for proc in procs:
      out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
      results.append((proc.returncode, out))
    return results
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def _check_two_processes(results: list[tuple[int, str]], workdir: str, coordinator: str) -> dict:
  """Both exited 0, each reported its index of 2 and the coordinator, step 2 was logged and
  checkpoint 2 committed; returns the run's config.json."""
  log = "\n---\n".join(out[-3000:] for _, out in results)
  assert [code for code, _ in results] == [0, 0], log
  for i, (_, out) in enumerate(results):
    assert f"distributed: process {i} of 2, coordinator {coordinator}, 1 local device(s)" in out
    assert not [line for line in out.splitlines() if line.startswith("error:")], log
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert max(r["step"] for r in records) == 2 and all(math.isfinite(r["loss"]) for r in records)
  assert "2" in os.listdir(os.path.join(workdir, "checkpoints")), log
  assert not fh.in_flight_writes(workdir)
  with open(os.path.join(workdir, "config.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
  """The tiny corpus prepared once (two processes must not race to build it), a compile
  cache shared by the runs, and the environment of a launched command."""
  from transformer.data import sources
  from transformer.train import experiment

  root = tmp_path_factory.mktemp("scaling")
  data_dir = str(root / "tfds")
  config = runpy.run_path(TINY_CONFIG)["get_config"]()
  config.data.data_dir = data_dir
  sources.open_splits(experiment.validate(config).data, root / "prepare")
  env = {
    k: v for k, v in fh.child_env().items() if not k.startswith(FOREIGN) and k not in FOREIGN_NAMES
  }
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # `python`
  home = root / "home"  # a TPU worker's home, holding the checkout as `transformer`
  home.mkdir()
  os.symlink(REPO, home / "transformer")
  return {"root": root, "data_dir": data_dir, "env": env, "home": str(home)}


def test_documented_blocks_are_the_three_launchers():
  blocks = _blocks()
  assert "srun env TRANSFORMER_DISTRIBUTED=1 python train.py" in blocks["slurm"]
  assert "--worker=all" in shlex.split(blocks["tpu"])
  assert re.match(
    r"TRANSFORMER_COORDINATOR=HOST0:PORT TRANSFORMER_NUM_PROCESSES=N TRANSFORMER_PROCESS_ID=I ",
    blocks["explicit"],
  )


def test_slurm_command_runs_as_two_tasks_of_one_node(setting):
  block = _blocks()["slurm"]
  srun = [line for line in block.splitlines() if line.startswith("srun ")]
  assert len(srun) == 1, block
  # JAX gives each Slurm task one GPU (number SLURM_LOCALID): one task per GPU.
  sbatch = dict(re.findall(r"--([\w-]+)=(\d+)", "".join(re.findall(r"#SBATCH(.*)", block))))
  assert sbatch["ntasks-per-node"] == sbatch["gpus-per-node"], block
  workdir = str(setting["root"] / "slurm")
  argv = shlex.split(_tiny(srun[0], workdir, setting["data_dir"]))[1:]  # srun runs the rest
  # JAX's port for a Slurm job: 61440 + SLURM_JOB_ID % 4096; a job id giving a free one.
  port = _free_port(61440, 65535)
  job = 4096 * 9 + port - 61440
  step = {
    "SLURM_JOB_ID": str(job),
    "SLURM_JOBID": str(job),
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_NPROCS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_NNODES": "1",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_NODELIST": "127.0.0.1",
    "SLURM_JOB_NODELIST": "127.0.0.1",
    "SLURM_STEP_NODELIST": "127.0.0.1",
    "SLURMD_NODENAME": "127.0.0.1",
    "SLURM_NODEID": "0",
    "SLURM_SUBMIT_DIR": REPO,
  }
  base = dict(setting["env"], **step, JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}")
  tasks = [(argv, dict(base, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)), REPO) for i in range(2)]
  config = _check_two_processes(_run_all(tasks), workdir, f"127.0.0.1:{port}")
  # FSDP over the 2 processes
  assert config["mesh"] == {"data": -1, "fsdp": 2, "tensor": 1, "expert": 1, **_SINGLE_SLICE}
  assert config["model"]["dtype"] == "bfloat16"  # the command's own override


def test_explicit_command_runs_as_two_processes(setting):
  workdir = str(setting["root"] / "explicit")
  command = _tiny(_blocks()["explicit"], workdir, setting["data_dir"])
  port = _free_port()
  env = dict(setting["env"], JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}")
  runs = []
  for i in range(2):
    filled = command.replace("HOST0:PORT", f"127.0.0.1:{port}")
    filled = filled.replace("_PROCESSES=N ", "_PROCESSES=2 ").replace("_ID=I ", f"_ID={i} ")
    assert not re.search(r"\b(HOST0|PORT|N|I)\b", filled), filled
    runs.append((["bash", "-c", filled], env, REPO))
  config = _check_two_processes(_run_all(runs), workdir, f"127.0.0.1:{port}")
  assert config["mesh"] == {
    "data": -1,
    "fsdp": 1,
    "tensor": 1,
    "expert": 1,
    **_SINGLE_SLICE,
  }  # data parallel


def _tpu_worker_command(setting, workdir: str) -> str:
  """The string `gcloud ... ssh --worker=all --command` runs on every worker."""
  argv = shlex.split(_blocks()["tpu"])
  assert argv[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"] and "--worker=all" in argv
  command = argv[argv.index("--command") + 1]
  assert command.startswith("cd transformer && TRANSFORMER_DISTRIBUTED=1 python train.py ")
  return _tiny(command, workdir, setting["data_dir"])


def test_tpu_pod_command_runs_on_two_workers_given_the_slice(setting):
  """JAX's TPU detection needs a TPU VM; the explicit variables stand in for it."""
  workdir = str(setting["root"] / "tpu")
  command = _tpu_worker_command(setting, workdir)
  port = _free_port()
  env = dict(
    setting["env"],
    TRANSFORMER_COORDINATOR=f"127.0.0.1:{port}",
    TRANSFORMER_NUM_PROCESSES="2",
    JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}",
  )
  workers = [
    (["bash", "-c", command], dict(env, TRANSFORMER_PROCESS_ID=str(i)), setting["home"])
    for i in range(2)
  ]
  config = _check_two_processes(_run_all(workers), workdir, f"127.0.0.1:{port}")
  assert config["mesh"] == {"data": -1, "fsdp": 2, "tensor": 1, "expert": 1, **_SINGLE_SLICE}


def test_tpu_pod_command_without_a_cluster_is_one_error_line(setting):
  workdir = str(setting["root"] / "tpu_alone")
  command = _tpu_worker_command(setting, workdir)
  [(code, out)] = _run_all([(["bash", "-c", command], setting["env"], setting["home"])])
  errors = [line for line in out.splitlines() if line.startswith("error:")]
  assert code == 1 and len(errors) == 1 and "Traceback" not in out, out[-3000:]
  assert errors[0].startswith("error: TRANSFORMER_DISTRIBUTED=1 but JAX detected no cluster")
  assert "TRANSFORMER_COORDINATOR" in errors[0]
  assert not os.path.exists(workdir)  # stopped before anything was written


@pytest.mark.parametrize(
  "variables, message",
  [
    ({"TRANSFORMER_NUM_PROCESSES": "2"}, "is set but TRANSFORMER_PROCESS_ID is not"),
    ({"TRANSFORMER_NUM_PROCESSES": "two", "TRANSFORMER_PROCESS_ID": "0"}, "must be integers"),
    ({"TRANSFORMER_NUM_PROCESSES": "2", "TRANSFORMER_PROCESS_ID": "2"}, "is not in 0 .. 1"),
  ],
)
def test_incomplete_explicit_variables_are_one_error_line(setting, variables, message):
  workdir = str(setting["root"] / "incomplete")
  env = dict(setting["env"], TRANSFORMER_COORDINATOR="127.0.0.1:9", **variables)
  argv = [sys.executable, "train.py", f"--config={TINY_CONFIG}", f"--workdir={workdir}"]
  [(code, out)] = _run_all([(argv, env, REPO)])
  errors = [line for line in out.splitlines() if line.startswith("error:")]
  assert code == 1 and len(errors) == 1 and message in errors[0], out[-3000:]
  assert not os.path.exists(workdir)
