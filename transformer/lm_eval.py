"""lm-evaluation-harness tasks on a trained language model.

  python -m transformer.lm_eval --workdir runs/lm_shakespeare --tasks shakespeare_continuation
  python -m transformer.lm_eval --workdir DIR --tasks hellaswag,arc_easy --limit 100 --num_fewshot 5
  python -m transformer.lm_eval --workdir DIR --tasks my_task --include_path my_tasks/

`--workdir` is a run of this project (its saved config and latest checkpoint, or
`--checkpoint STEP`), trained from scratch or from an imported checkpoint (`init_from`).
`--tasks`: comma-separated names: our shipped tasks (`shakespeare_continuation`), the
harness's own (their datasets must be in the local `datasets` cache when offline), or
tasks defined by YAML files under `--include_path`. The harness's results are written to
WORKDIR/lm_eval_step_<STEP>.json, and each task's scores to TensorBoard and metrics.jsonl
as split `lm_eval` (`lm_eval/TASK/METRIC`); the table is printed. The adapter is
transformer/evaluators/harness_lm.py.
"""

from __future__ import annotations

import argparse
import json

from etils import epath


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, help="a training run's directory")
  parser.add_argument("--tasks", required=True, help="comma-separated task names")
  parser.add_argument("--limit", type=int, default=0, help="documents per task (0 = all)")
  parser.add_argument("--num_fewshot", type=int, default=None, help="examples per prompt")
  parser.add_argument("--include_path", action="append", default=[], help="task YAML folder")
  parser.add_argument("--checkpoint", type=int, default=None, help="step (default: latest)")
  parser.add_argument("--batch_size", type=int, default=8, help="rows per scoring call")
  args = parser.parse_args(argv)
  names = [n for n in args.tasks.split(",") if n]

  from transformer.evaluators.harness import adapter

  harness = adapter()
  harness.task_configs(names, args.include_path)  # an unknown name fails before the restore
  from transformer.eval.evaluate import restore
  from transformer.train.metric_writers import MetricWriter

  s, state, step = restore(args.workdir, args.checkpoint)
  if s.model_cfg.family != "decoder":
    raise SystemExit(
      f"--workdir {args.workdir}: a {s.model_cfg.family!r} model; lm-eval scores decoders"
    )
  lm = harness.HarnessLM(s.model, state.params, s.info.tokenizer, batch_size=args.batch_size)
  results = harness.evaluate_tasks(lm, names, args.limit, args.num_fewshot, args.include_path)
  results["step"] = step
  path = epath.Path(args.workdir) / f"lm_eval_step_{step}.json"
  path.write_text(json.dumps(results, indent=1, sort_keys=True), encoding="utf-8")
  writer = MetricWriter(args.workdir, is_primary=True, console=False)
  writer.write_scalars(step, harness.scalars(results), split="lm_eval")
  writer.close()
  for name, value in harness.scalars(results).items():  # not lm_eval's table: it forks
    print(f"{name}: {value:.4f}")
  print(f"results: {path}")
  return results


if __name__ == "__main__":
  main()
