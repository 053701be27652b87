"""lm-evaluation-harness tasks on a trained language model.

  python -m transformer.lm_eval --workdir runs/lm_shakespeare --tasks shakespeare_continuation
  python -m transformer.lm_eval --workdir DIR --tasks hellaswag,arc_easy --limit 100 --num_fewshot 5
  python -m transformer.lm_eval --workdir DIR --tasks my_task --include_path my_tasks/
  python -m transformer.lm_eval --model hf:Qwen/Qwen3-0.6B --output runs/qwen_eval --tasks ...

`--workdir` is a run of this project (its saved config and latest checkpoint, or
`--checkpoint STEP`), trained from scratch or from an imported checkpoint (`init_from`),
whose W&B run (if it has one) gets the scores too;
`--model hf:DIR` (or `hf:ORG/NAME` from the Hugging Face cache) is a checkpoint read as
`init_from` reads it, with its own tokenizer, results written under `--output`.
`--tasks`: comma-separated names: our shipped tasks (`shakespeare_continuation`), the
harness's own (their datasets must be in the local `datasets` cache when offline), or
tasks defined by YAML files under `--include_path`. The harness's results are written to
WORKDIR/lm_eval_step_<STEP>.json, and each task's scores to TensorBoard, W&B and
metrics.jsonl as split `lm_eval` (`lm_eval/TASK/METRIC`; `TASK/METRIC` in metrics.jsonl);
the scores are printed. The adapter is
transformer/evaluators/harness_lm.py.
"""

from __future__ import annotations

import argparse
import json

from etils import epath


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  where = parser.add_mutually_exclusive_group(required=True)
  where.add_argument("--workdir", help="a training run's directory")
  where.add_argument("--model", help="hf:DIR or hf:ORG/NAME, a Hugging Face checkpoint")
  parser.add_argument("--output", help="with --model: the folder for the results")
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
  if args.model:
    if not args.output:
      parser.error("--model needs --output (a folder for the results)")
    model, params, tokenizer, step = _pretrained(args.model)
    out = args.output
  else:
    from transformer.eval.evaluate import load_config, restore

    s, state, step = restore(args.workdir, args.checkpoint)
    model, params, tokenizer, out = s.model, state.params, s.info.tokenizer, args.workdir
  if model.config.family != "decoder":
    raise SystemExit(f"{args.workdir or args.model}: a {model.config.family!r} model; lm-eval "
                     "scores decoders")  # fmt: skip
  lm = harness.HarnessLM(model, params, tokenizer, batch_size=args.batch_size)
  results = harness.evaluate_tasks(lm, names, args.limit, args.num_fewshot, args.include_path)
  results["step"] = step
  path = epath.Path(out) / f"lm_eval_step_{step}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(results, indent=1, sort_keys=True), encoding="utf-8")
  from transformer.train.metric_writers import MetricWriter
  from transformer.train.tracking import WandbTracker

  tracker = None  # the training run's own W&B run, when it has one (resumed by its id)
  if args.workdir:
    tracker = WandbTracker.start(s.exp.wandb, args.workdir, load_config(args.workdir), True)
  writer = MetricWriter(out, is_primary=True, console=False, trackers=[tracker] if tracker else [])
  scores = {k.removeprefix("lm_eval/"): v for k, v in harness.scalars(results).items()}
  writer.write_scalars(step, scores, split="lm_eval")  # lm_eval/TASK/METRIC
  writer.close()
  for name, value in harness.scalars(results).items():  # not lm_eval's table: it forks
    print(f"{name}: {value:.4f}")
  print(f"results: {path}")
  return results


def _pretrained(source: str) -> tuple:
  """(model, parameters, tokenizer, step 0) of an `hf:` checkpoint, read as `init_from`
  reads it (transformer/convert), with the tokenizer files of its directory."""
  from transformer.convert import sources, tokenizers
  from transformer.nn.models import build_model
  from transformer.train.setup import load_trained

  found = sources.find(source)
  if found is None or found[0] is not sources.HF:
    raise SystemExit(f"--model {source!r}: expected hf:DIR or hf:ORG/NAME")
  config, params = load_trained(source)
  return build_model(config), params, tokenizers.from_pretrained_dir(found[1]), 0


if __name__ == "__main__":
  main()
