"""Regenerates docs/RESULTS.md from the runs themselves: no figure is copied by hand.

  python scripts/results.py [--manifest scripts/results.toml] [--out docs/RESULTS.md]
                            [--images docs/images/results] [--root .] [--check]

The manifest (scripts/results.toml; its header documents the fields) lists the recipes:
name, config, workdir, extra flags, the metrics to show with their labels and formats,
and optional targets. For each recipe whose workdir exists the page shows
  * from WORKDIR/runs.jsonl (one record per train.py invocation,
    transformer/train/guard/run_record.py): the last invocation that completed training steps:
    its wall time from the process start, CPU user + system seconds, the CPU's vector ISA,
    the load average at its start and end, the steps it trained;
  * from WORKDIR/metrics.jsonl: the last line of the recipe's split ("eval"), i.e. the
    final evaluation;
  * WORKDIR/curves.png, copied to IMAGES/<name>.png.
scripts/results_inputs.py reads the manifest and the workdirs; this file writes the page.
A recipe whose workdir is missing is listed as "not run" with its command (and its image,
if one was left from an earlier run, is removed so the page and the images agree).

The output depends only on the manifest and the runs' files: rows sorted by name, fixed
number formats, no time of generation, so rerunning on the same runs changes nothing
(`--check` exits 1, writing nothing, when the page or an image would change). Workdirs may
be `gs://` URLs (read through `etils.epath`). Relative paths are relative to `--root`
(default: the repository holding this script).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # results_inputs.py beside it, also when loaded by path, not run
  sys.path.insert(0, HERE)
from results_inputs import Manifest, Result, Target, collect, load_manifest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "scripts" / "results.toml"
DASH = "—"


# ---------------------------------------------------------------------------------------
# Formatting: fixed formats, so the same runs give the same page.


def isa_label(flags: Sequence[str]) -> str:
  """The widest vector ISA among /proc/cpuinfo flags: 'AVX-512 + BF16', 'AVX2', ..."""
  flags = set(flags)
  if "amx_tile" in flags:
    return "AMX"
  if "avx512f" in flags:
    return "AVX-512 + BF16" if "avx512_bf16" in flags else "AVX-512"
  for flag, label in (("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2")):
    if flag in flags:
      return label
  return "unknown"


def format_seconds(seconds: float) -> str:
  """'76 s'; from 10 minutes on with the minutes: '828 s (13.8 min)'."""
  text = f"{seconds:.0f} s"
  return f"{text} ({seconds / 60:.1f} min)" if seconds >= 600 else text


def format_value(value: Any, spec: str) -> str:
  """`value` in the manifest's format spec; a missing or non-finite value is a dash."""
  if not isinstance(value, (int, float)) or not math.isfinite(value):
    return DASH
  return format(float(value), spec)


def _cell(text: str) -> str:
  """Table-cell text: a '|' would end the cell."""
  return text.replace("|", "\\|").replace("\n", " ")


def _normalised(command: str) -> list[str]:
  """A train.py command's flags as sorted `--name=value` tokens (the program dropped)."""
  tokens = shlex.split(command)
  while tokens and not tokens[0].startswith("-"):
    tokens = tokens[1:]  # python, train.py (or -m transformer.train_main, an installed name)
  out, i = [], 0
  while i < len(tokens):
    token = tokens[i]
    if token in ("-m",):
      i += 2
      continue
    if token.startswith("-") and "=" not in token and i + 1 < len(tokens):
      if not tokens[i + 1].startswith("-"):
        token, i = f"{token}={tokens[i + 1]}", i + 1
    out.append("--" + token.lstrip("-"))
    i += 1
  return sorted(out)


def row(result: Result) -> list[str]:
  """One table row: recipe, command, wall, CPU, ISA, load, steps, metrics."""
  r = result.recipe
  name = f"**{r.name}**: {r.title}" + (f" (after {r.after})" if r.after else "")
  command = f"`{r.command}`"
  if not result.ran:
    return [name, command, "not run", DASH, DASH, DASH, DASH, "not run"]
  run = result.run
  if run is None:
    wall = cpu = isa = load = steps = "no run record"
  else:
    recorded = run.get("command")
    if recorded and _normalised(recorded) != _normalised(r.command):
      command += f"<br>recorded: `{recorded}`"
    wall = format_seconds(run["wall_seconds"]) if "wall_seconds" in run else DASH
    user, system = run.get("cpu_user_seconds"), run.get("cpu_system_seconds")
    cpu = f"{user:.0f} + {system:.0f} s" if user is not None and system is not None else DASH
    isa = isa_label(run.get("isa", []))
    start, end = run.get("load_start"), run.get("load_end")
    load = f"{start[0]:.1f} → {end[0]:.1f}" if start and end else DASH
    first, last = run.get("first_step"), run.get("last_step")
    steps = f"{first:,}–{last:,}" if first is not None else "none trained"
    if run.get("status") != "completed":
      steps += f" ({run.get('status')})"
    if result.legs > 1:
      steps += f"; {result.legs} invocations"
  if result.metrics is None:
    metrics = "no evaluation in metrics.jsonl"
  else:
    parts = [
      f"{m.label} {'**' if i == 0 else ''}{format_value(result.metrics.get(m.key), m.format)}"
      f"{'**' if i == 0 else ''}"
      for i, m in enumerate(r.metrics)
    ]
    metrics = "; ".join(parts) + f" (step {result.metrics.get('step', '?'):,})"
    if r.about:
      metrics += f"; {r.about}"
  return [name, command, wall, cpu, isa, load, steps, metrics]


def _target_line(result: Result, target: Target, by_name: dict[str, Result]) -> str:
  """'- lm_shakespeare: loss ≤ 1.88 (why): **met**, 1.8396'."""
  r = result.recipe
  metric = next((m for m in r.metrics if m.key == target.metric), None)
  spec = metric.format if metric else ".4g"
  wall = target.metric == "wall_seconds"

  def show(v: float) -> str:
    return format_seconds(v) if wall else format_value(v, spec)

  def show_bound(v: float) -> str:
    if wall:
      return format_seconds(v)
    return f"{100 * v:g}%" if spec.endswith("%") else f"{v:g}"

  label = "wall time" if wall else (metric.label if metric else target.metric)
  value = result.value(target.metric)
  if target.above is not None:
    other = by_name[target.above]
    goal = f"{label} above {target.above}'s"
    theirs = other.value(target.metric)
    if value is None or theirs is None:
      verdict = "not run" if not (result.ran and other.ran) else "no value"
    else:
      verdict = f"**{'met' if value > theirs else 'not met'}**, {show(value)} vs {show(theirs)}"
  else:
    at_most = target.at_most is not None
    bound = target.at_most if at_most else target.at_least
    goal = f"{label} {'≤' if at_most else '≥'} {show_bound(bound)}"
    if value is None:
      verdict = "not run" if not result.ran else "no value"
    else:
      ok = value <= bound if at_most else value >= bound
      verdict = f"**{'met' if ok else 'not met'}**, {show(value)}"
  why = f" ({target.why})" if target.why else ""
  return f"- {r.name}{why}: {goal}: {verdict}"


def _machines(results: Sequence[Result]) -> list[str]:
  """One line per distinct machine and software the reported runs used."""
  seen: dict[str, list[str]] = {}
  for result in results:
    run = result.run
    if run is None:
      continue
    v = run.get("versions", {})
    family = f" ({run['cpu_family']})" if run.get("cpu_family") else ""
    line = (
      f"{run.get('cpu_model') or 'unknown CPU'}{family}, {run.get('cpu_count', '?')} CPUs "
      f"(flags: {' '.join(run.get('isa', [])) or 'none listed'}); "
      f"{run.get('platform', '?')} × {run.get('device_count', '?')} device(s); "
      f"JAX {v.get('jax', '?')}, jaxlib {v.get('jaxlib', '?')}, Flax {v.get('flax', '?')}, "
      f"Python {v.get('python', '?')}"
    )
    seen.setdefault(line, []).append(result.recipe.name)
  return [f"- {line}: {', '.join(names)}" for line, names in sorted(seen.items())]


HEADER = """\
# Results of the shipped-data recipes

<!-- Generated by scripts/results.py from the runs; edit scripts/results.toml, not this
file. -->

This page is generated from the runs, not typed: `python scripts/results.py` reads the
recipes of `scripts/results.toml` and, for each whose workdir exists, the record that
`train.py` appends to `WORKDIR/runs.jsonl` at the end of every invocation (the last one
that completed training steps) and the final evaluation in `WORKDIR/metrics.jsonl`; it
copies `WORKDIR/curves.png` to `{images_dir}/`. Recipes without a workdir are listed
as not run, with the command that runs them.

To regenerate: run the commands below from the repository root (`runs/` is git-ignored;
a recipe marked "after" needs that run first), then `python scripts/results.py`.

- wall: seconds from the start of the `train.py` process (interpreter start-up, data
  preparation, compilation and evaluations included) to the end of training; CPU: user +
  system seconds of the process and its children. The machine may be shared with other
  jobs, so wall times vary with the load; CPU seconds are the steadier figure.
- ISA: the widest vector extension the CPU reports (the full flags under Machines).
- load: the 1-minute load average at the invocation's start and end.
- steps: the updates that invocation trained (a resumed run reports its last leg).
- metrics: the last evaluation in metrics.jsonl; the first one in bold.
"""


def render(
  manifest: Manifest, results: Sequence[Result], images_rel: str, images_dir: str = ""
) -> str:
  """The Markdown page; images are linked at `images_rel` (relative to the page) and named
  `images_dir` (as the reader finds them from the repository root) in the prose."""
  lines = [HEADER.format(images_dir=images_dir or images_rel)]
  columns = ["recipe", "command", "wall", "CPU user + sys", "ISA", "load", "steps", "metrics"]
  lines.append("| " + " | ".join(columns) + " |")
  lines.append("| " + " | ".join("---" for _ in columns) + " |")
  for result in results:
    lines.append("| " + " | ".join(_cell(c) for c in row(result)) + " |")
  lines.append("")
  by_name = {r.recipe.name: r for r in results}
  targets = [_target_line(r, t, by_name) for r in results for t in r.recipe.targets]
  if targets:
    lines += ["## Targets", "", *targets, ""]
  machines = _machines(results)
  if machines:
    lines += ["## Machines", "", *machines, ""]
  curves = [r for r in results if r.ran and r.curves is not None]
  if curves:
    lines += ["## Curves", ""]
    lines.append("Loss (train solid, eval dashed) and learning rate against step, from")
    lines.append("each run's metrics.jsonl (`curves.png` in its workdir).")
    lines.append("")
    for result in curves:
      r = result.recipe
      lines += [f"### {r.name}", "", f"![{r.name}: {r.title}]({images_rel}/{r.name}.png)", ""]
  for title, text in manifest.notes:
    lines += [f"## {title}", "", text, ""]
  return "\n".join(lines).rstrip("\n") + "\n"


def generate(
  manifest_path: str | os.PathLike = MANIFEST,
  out: str | os.PathLike = REPO / "docs" / "RESULTS.md",
  images: str | os.PathLike = REPO / "docs" / "images" / "results",
  root: str | os.PathLike = REPO,
  check: bool = False,
) -> list[str]:
  """Writes the page and the images (with `check`: only compares); returns the paths that
  changed (or would change)."""
  root, out, images = Path(root), Path(out), Path(images)
  manifest = load_manifest(manifest_path)
  results = [collect(r, root) for r in manifest.recipes]
  images_rel = Path(os.path.relpath(images, out.parent)).as_posix()
  images_dir = Path(os.path.relpath(images, root)).as_posix()
  page = render(manifest, results, images_rel, images_dir)
  wanted: dict[Path, bytes | None] = {out: page.encode()}
  for result in results:
    wanted[images / f"{result.recipe.name}.png"] = result.curves if result.ran else None
  changed = []
  for path, data in wanted.items():
    current = path.read_bytes() if path.exists() else None
    if current == data:
      continue
    changed.append(os.fspath(path))
    if check:
      continue
    if data is None:
      path.unlink()
    else:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_bytes(data)
  return changed


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--manifest", default=MANIFEST, help="the recipes (TOML)")
  parser.add_argument("--out", default=REPO / "docs" / "RESULTS.md", help="the page")
  parser.add_argument(
    "--images", default=REPO / "docs" / "images" / "results", help="where curves go"
  )
  parser.add_argument("--root", default=REPO, help="relative workdirs and configs are under it")
  parser.add_argument(
    "--check", action="store_true", help="write nothing; exit 1 if anything would change"
  )
  args = parser.parse_args(argv)
  try:
    changed = generate(args.manifest, args.out, args.images, args.root, args.check)
  except (OSError, ValueError, tomllib.TOMLDecodeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  for path in changed:
    print(f"{'would change' if args.check else 'wrote'}: {os.path.relpath(path)}")
  if not changed:
    print("up to date")
  return 1 if args.check and changed else 0


if __name__ == "__main__":
  sys.exit(main())
