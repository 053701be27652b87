"""Everything built from a validated experiment before the first step: `build(exp, workdir)`.

Shared by training (`train/loop.py`) and evaluation (`eval/evaluate.py`): the task's data
(grain iterators), the model with the sizes the data decides, the optimizer, the compiled
steps (`StepRunner`) and an initial train state. Also the run's saved model config, and
the one rule that decides whether a saved run and a config describe the same model.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
from etils import epath

from transformer.convert import hf, sources
from transformer.convert import tokenizers as _  # noqa: F401  (load_tokenizer: 'pretrained')
from transformer.data.datasets import DataInfo, make_datasets
from transformer.data.files import write_atomic
from transformer.nn import lora, partitioning
from transformer.nn.config import RUNTIME_FIELDS, ModelConfig
from transformer.nn.kernel_rules import resolve_attention_impl
from transformer.nn.models import build_model
from transformer.tasks import Task
from transformer.train import compile_cache, finetune
from transformer.train.experiment import Experiment, finalize_model
from transformer.train.optimizer import create_optimizer
from transformer.train.parallel import StepRunner, Update
from transformer.train.step import StepConfig, TrainState, create_train_state, train_step

MODEL_CONFIG_FILE = "model_config.json"


@dataclasses.dataclass
class Setup:
  """Everything built from a config before the first step."""

  exp: Experiment
  info: DataInfo
  train_iter: Any
  eval_factory: Any
  model_cfg: ModelConfig
  model: Any
  tx: Any
  runner: StepRunner
  state: TrainState  # freshly initialised (not yet restored)
  cache_folder: str | None = None  # the compilation cache in use (`compile_cache.use`)


def zeros_batch(info: DataInfo, train: bool = True, rows: int | None = None) -> dict:
  """A batch of zeros with the data's shapes (for init and compilation)."""
  out = {}
  for key, (shape, dtype) in info.batch_shapes(train).items():
    out[key] = np.zeros((rows or shape[0], *shape[1:]), dtype)
  return out


def init_params(model, task: Task, info: DataInfo, seed: int, abstract: bool = False) -> Any:
  """Float32 parameters of `model`, shaped by one row of the task's batches (their
  shapes and dtypes only, as `jax.ShapeDtypeStruct`s, if `abstract`)."""
  args, kwargs = task.init_args(zeros_batch(info, rows=1))
  rng = jax.random.PRNGKey(seed)
  init = lambda r: model.init(r, *args, **kwargs)
  if abstract or model.config.lora_rank:
    shapes = jax.eval_shape(init, rng)["params"]
    if model.config.lora_rank:  # a LoRA target matching nothing: one line, before compiling
      lora.check_targets(model.config, shapes)
    if abstract:
      return shapes
  return jax.jit(init)(rng)["params"]


def build(
  exp: Experiment, workdir: str, abstract: bool = False, update: Update = train_step
) -> Setup:
  """Data, model, optimizer, compiled steps and an initial state for `exp`; with
  `abstract`, the state is shapes only (`jax.ShapeDtypeStruct`s: the dry run's). `update`
  is the function the runner compiles: the loop's own (`train/loop.py`), else the plain
  `step.train_step`."""
  loop = exp.loop
  cache_folder = compile_cache.use(loop.compilation_cache_dir)  # programs reused across runs
  attention_impl, why = resolve_attention_impl(exp.model)  # a missing GPU / TPU fails here
  print(f"attention: {attention_impl} ({why})")
  exp = dataclasses.replace(exp, data=finetune.hf_tokenizer_data(loop.init_from, exp.data, workdir))
  finetune.record_pretrained(exp, workdir)  # resumes and eval.py read it, not the checkpoint
  train_iter, eval_factory, info = make_datasets(
    exp.data, exp.task.data_spec(), workdir, loop.batch_size, loop.seq_len, loop.seed
  )
  if loop.init_from:
    finetune.check_init_tokenizer(loop.init_from, info)
  model_cfg = finalize_model(exp, info.vocab_size, info.num_classes)
  longest = max(info.seq_len, info.target_seq_len)
  if not exp.task.images and longest > model_cfg.max_len:
    raise ValueError(f"config.seq_len={longest} exceeds config.model.max_len={model_cfg.max_len}")
  model = build_model(model_cfg.replace(attention_impl=attention_impl))
  # e.g. a distillation teacher, a preference reference ('' names the run's init_from)
  task, frozen = exp.task.frozen(model_cfg, lambda source: load_trained(source or loop.init_from))
  exp = dataclasses.replace(exp, task=task)
  params = init_params(model, exp.task, info, loop.seed, abstract)
  tx = create_optimizer(
    exp.optimizer, exp.schedule, params, trainable=lora.trainable(model_cfg, params)
  )
  step_cfg = StepConfig(
    model=model,
    tx=tx,
    task=exp.task,
    grad_accum_steps=loop.grad_accum_steps,
    schedule=exp.schedule,
    ema_decay=exp.ema.ema_decay,
    ema_warmup=exp.ema.ema_warmup,
  )
  mesh = partitioning.make_mesh(exp.mesh.shape(), dcn=exp.mesh.dcn())
  print(f"mesh: {partitioning.describe(mesh)}")
  runner = StepRunner(step_cfg, loop.parallelism, mesh, exp.rules, update=update)
  runner.check_batch_size(info.batch_size // loop.grad_accum_steps, "batch_size / grad_accum_steps")
  runner.check_batch_size(info.eval_batch_size, "data.eval_batch_size")
  initial = lambda p: create_train_state(
    p, tx, jax.random.PRNGKey(loop.seed + 1), ema=exp.ema.enabled, frozen=frozen
  )
  state = jax.eval_shape(initial, params) if abstract else initial(params)
  return Setup(
    exp, info, train_iter, eval_factory, model_cfg, model, tx, runner, state, cache_folder
  )


def load_trained(source: str) -> tuple[ModelConfig, Any]:
  """The model config and parameters of a trained model: `hf:DIR` (a Hugging Face
  directory), or another run of this project (its workdir: the model config it saved and
  its latest checkpoint's parameters)."""
  if not source:
    raise ValueError("names no model (nor does config.init_from)")
  found = sources.find(source)
  if found is not None and found[0] is sources.HF:
    config, variables = hf.load(found[1])
    return config, variables["params"]
  params = finetune.restore_run(source, field=None)[1]
  return load_model_config(source), params


def load_model_config(workdir: str) -> ModelConfig:
  """The finalized model config a run saved in its workdir (a local folder or a URL)."""
  path = epath.Path(workdir) / MODEL_CONFIG_FILE
  if not path.exists():
    raise FileNotFoundError(f"{path}: no saved model config (is {workdir} a training workdir?)")
  try:
    fields = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: unreadable saved model config ({e})") from None
  if not isinstance(fields, dict):
    raise ValueError(f"{path}: the saved model config is not a JSON object")
  return ModelConfig(**fields)


def save_model_config(workdir: str, model_cfg: ModelConfig) -> None:
  write_atomic(os.path.join(workdir, MODEL_CONFIG_FILE), json.dumps(model_cfg.to_dict(), indent=2))


def check_same_model(workdir: str, model_cfg: ModelConfig) -> None:
  """A workdir holding another model's run is an error naming the differing fields
  (`RUNTIME_FIELDS` may differ)."""
  if not (epath.Path(workdir) / MODEL_CONFIG_FILE).exists():
    return
  saved = load_model_config(workdir).to_dict()
  diffs = [
    f"model.{k}: checkpoint {saved.get(k)!r} vs config {v!r}"
    for k, v in model_cfg.to_dict().items()
    if k not in RUNTIME_FIELDS and saved.get(k) != v
  ]
  if diffs:
    raise ValueError(
      f"{workdir} holds a run of a different model ({'; '.join(diffs)}); "
      "use another --workdir or the same model settings"
    )
