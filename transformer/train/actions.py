"""What the training loop does between updates, as small objects with one shape: each says
whether it is due after update `done` (`due(done)`) and does its work (`run(...)`), in
the manner of clu's `periodic_actions`. `train/loop.py` builds them once and calls them
in order after every update:

  Throughput   tokens and examples since the last log line, minus the time spent in
               evaluations and saves (`paused()`)
  Log          one console / metrics line every `log_every` updates
  Evaluate     the evaluation split's loss metrics, the due evaluators' and the EMA's;
               after the last update, the evaluators that run at the end (`finish`)
  Save         a checkpoint every `checkpoint_every` updates, never past a NaN

plus `evaluate` (loss metrics over an evaluation split; also `eval.py`'s) and `ema_view`.
`for_run` builds a run's `Actions`, with the NaN/Inf watch and the profile window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from transformer import evaluators
from transformer.data.progress import progress
from transformer.tasks import Run, Task
from transformer.train import telemetry
from transformer.train.checkpoints import CheckpointManager
from transformer.train.experiment import Experiment
from transformer.train.guard import NonFinite
from transformer.train.metric_writers import MetricWriter
from transformer.train.parallel import StepRunner
from transformer.train.setup import Setup
from transformer.train.step import summarize_eval


def ema_view(state):
  """The state with its EMA weights as the parameters (for evaluation)."""
  if state.ema_params is None:
    raise ValueError("the train state has no EMA of the parameters (config.ema_decay=0)")
  return state.replace(params=state.ema_params)


def evaluate(
  runner: StepRunner,
  state,
  eval_factory: Callable[[], Iterator[dict[str, np.ndarray]]],
  max_batches: int = 0,
  should_stop: Callable[[], bool] | None = None,
  total: int | None = None,
  desc: str = "evaluating",
) -> dict | None:
  """Means over the evaluation split (or its first `max_batches` batches); None when
  `should_stop()`, asked before each batch, turned True (the evaluation is abandoned).
  `total`: the batches one pass over the split yields, for the progress lines (with an
  ETA) that a long evaluation prints under `desc` (process 0)."""
  totals: dict[str, float] = {}
  batches = eval_factory()
  if max_batches:
    batches = itertools.islice(batches, max_batches)
    total = min(max_batches, total) if total else max_batches
  for batch in progress(batches, total, desc, enabled=jax.process_index() == 0):
    if should_stop is not None and should_stop():
      return None
    sums = jax.device_get(runner.eval(state, batch))
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  if not totals:
    raise ValueError("the evaluation split produced no batches")
  return summarize_eval(totals)


class Throughput:
  """Tokens (the task's count) and examples since the last `rates()`, over the time spent
  training: evaluations and saves run inside `paused()` and do not count."""

  def __init__(self, task: Task):
    self.task = task
    self.start, self.tokens, self.examples = time.perf_counter(), 0.0, 0

  def add(self, batch: dict[str, np.ndarray]) -> None:
    self.tokens += self.task.count(batch)
    self.examples += len(next(iter(batch.values())))

  @contextlib.contextmanager
  def paused(self):
    began = time.perf_counter()
    try:
      yield
    finally:
      self.start += time.perf_counter() - began

  def rates(self) -> tuple[float, float]:
    """Global (tokens/s, examples/s) since the last call, which starts a new interval."""
    now = time.perf_counter()
    elapsed = max(now - self.start, 1e-9)
    rates = (
      self.tokens * jax.process_count() / elapsed,
      self.examples * jax.process_count() / elapsed,
    )
    self.start, self.tokens, self.examples = now, 0.0, 0
    return rates


@dataclasses.dataclass
class Log:
  """One line of the update's metrics and the throughput every `every` updates (and at
  the first update of the run and the last)."""

  every: int
  first: int
  total: int
  writer: MetricWriter
  throughput: Throughput
  runner: StepRunner
  skip_nonfinite: bool
  flops_per_count: float = 0.0  # training FLOPs per unit the task counts (MFU)
  peak_flops: float | None = None  # of one device; None: no MFU
  sources: Any = None  # a data mixture's `mixture.Sources`: batches and epochs of each

  def due(self, done: int) -> bool:
    return done % self.every == 0 or done == self.total or done == self.first

  def run(self, state, done: int, metrics: dict) -> None:
    scalars = {k: float(v) for k, v in jax.device_get(metrics).items() if k != "nonfinite_inputs"}
    scalars["tokens_per_sec"], scalars["examples_per_sec"] = self.throughput.rates()
    if self.peak_flops is not None and self.flops_per_count:
      scalars["mfu"] = telemetry.mfu(
        self.flops_per_count, scalars["tokens_per_sec"], self.peak_flops, jax.device_count()
      )
    if self.skip_nonfinite:
      host = self.runner.host_state(state)
      scalars["nonfinite_skipped"] = int(jax.device_get(host.nonfinite_count))
    empty = 0 if state.empty_count is None else int(np.max(jax.device_get(state.empty_count)))
    if empty:  # updates skipped because their global normalizer was 0
      scalars["empty_skipped"] = empty
    if self.sources is not None:  # one training batch per update
      scalars |= self.sources.scalars(done)
    self.writer.write_scalars(done, scalars)


@dataclasses.dataclass
class Evaluate:
  """The loss metrics on the evaluation split every `eval_every` updates and after the
  last, plus the scalars of the periodic evaluators due then (`evaluators/`, those the
  config names or the task's) and the EMA weights' (`ema_<name>`, logged as split
  `eval_ema`). `run` returns None when a preemption notice interrupted it; `finish` runs
  the evaluators that run once at the end."""

  exp: Experiment
  runner: StepRunner
  eval_factory: Callable[[], Iterator[dict[str, np.ndarray]]]
  eval_batches_total: int  # batches one pass yields (progress lines)
  writer: MetricWriter
  view: Callable[[Any], Run]  # the model as the evaluators see it
  should_stop: Callable[[], bool] | None = None
  # a data mixture's sources: name -> (evaluation-iterator factory, batches), each scored
  # alone too (`<name>/loss`, ...)
  sources: dict[str, tuple[Callable, int]] = dataclasses.field(default_factory=dict)
  chosen: tuple[evaluators.Evaluator, ...] = dataclasses.field(init=False)  # from the config
  ahead: threading.Thread | None = dataclasses.field(init=False, default=None)  # compile_ahead

  def __post_init__(self):
    exp = self.exp
    self.chosen = evaluators.for_training(
      exp.eval.evaluators, exp.task, exp.evaluate, exp.loop.seed
    )

  def due(self, done: int) -> bool:
    every = self.exp.eval.eval_every
    return done == self.exp.loop.num_train_steps or bool(every and done % every == 0)

  def run(self, state, done: int) -> dict | None:
    self.wait_for_ahead()
    metrics = self.loss(state, f"evaluating at step {done}")
    for name, (factory, batches) in self.sources.items():
      if metrics is None:
        break
      desc = f"evaluating {name} at step {done}"
      alone = evaluate(
        self.runner, state, factory, self.exp.eval.eval_batches, self.should_stop, batches, desc
      )
      metrics = None if alone is None else metrics | {f"{name}/{k}": v for k, v in alone.items()}
    if metrics is None:
      return None
    total = self.exp.loop.num_train_steps
    due = [e for e in self.chosen if e.due(done, total)]
    run = self.view(state) if due else None
    for evaluator in due:  # their scalars join the loss metrics (e.g. 'bleu')
      result = evaluator.run(run)
      metrics |= {k: v for k, v in result.items() if type(v) in (int, float)}
    self.writer.write_scalars(done, metrics, split="eval")
    if not self.exp.ema.enabled:
      return metrics
    ema = self.loss(ema_view(state), f"evaluating the EMA at step {done}")
    if ema is None:
      return None
    self.writer.write_scalars(done, ema, split="eval_ema")
    return metrics | {f"ema_{k}": v for k, v in ema.items()}

  def compile_ahead(self, state, eval_batch: dict[str, np.ndarray]) -> None:
    """Starts compiling what the evaluations will run in a background thread, while the
    updates run (the loop calls it after the first update, so the first step waits for
    the train step alone): the evaluation step (for `eval_batch`'s shapes) and each
    evaluator's `compile_ahead` (an LM's final sample, on the primary process). The
    first evaluation and `finish` wait for the thread (`wait_for_ahead`), so nothing is
    compiled twice; what fails here compiles at first use, where its error is raised.
    Nothing under pmap, whose steps compile at first use."""
    if self.runner.parallelism != "jit":
      return
    shapes = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    params = jax.tree.map(shapes, state.params)  # not the arrays: the train step donates them
    run = dataclasses.replace(self.view(state), params=params)
    final = [e for e in self.chosen if e.at_end] if jax.process_index() == 0 else []

    def compile_all():
      try:
        self.runner.lower_eval(params, eval_batch).compile()
        for evaluator in final:
          evaluator.compile_ahead(run)
      except Exception as e:  # noqa: BLE001 (compiled again, and raised, at first use)
        print(f"compiling ahead stopped ({type(e).__name__}); the rest compiles at first use")

    self.ahead = threading.Thread(target=compile_all, name="compile-ahead")
    self.ahead.start()

  def wait_for_ahead(self) -> None:
    """Waits for `compile_ahead`'s thread, if one runs."""
    if self.ahead is not None:
      self.ahead.join()
      self.ahead = None

  def finish(self, state) -> None:
    """Runs the evaluators that run once at the end (an LM's sample; the loop calls it on
    the primary process) and logs the texts (tag -> text) and scalars they return."""
    self.wait_for_ahead()
    final = [e for e in self.chosen if e.at_end]
    run = self.view(state) if final else None
    for evaluator in final:
      result = evaluator.run(run)
      for tag, value in result.items():
        if isinstance(value, str):
          self.writer.write_text(run.step, tag, value)
      numbers = {k: v for k, v in result.items() if type(v) in (int, float)}
      if numbers:  # e.g. the harness's scores
        self.writer.write_scalars(run.step, numbers, split="eval")

  def loss(self, state, desc: str) -> dict | None:
    """The loss metrics alone (no log); None when interrupted (`should_stop`)."""
    batches, total = self.exp.eval.eval_batches, self.eval_batches_total
    return evaluate(self.runner, state, self.eval_factory, batches, self.should_stop, total, desc)


@dataclasses.dataclass
class Save:
  """A checkpoint every `checkpoint_every` updates and after the last (train state, this
  process's data-iterator position, the config; ranked by the evaluation's `best_metric`
  when one ran at that update)."""

  every: int
  total: int
  best_metric: str
  ckpt: CheckpointManager
  runner: StepRunner
  train_iter: Any
  config: Any
  writer: MetricWriter

  def due(self, done: int) -> bool:
    return done % self.every == 0 or done == self.total

  def run(self, state, done: int, evaluation: dict | None = None) -> None:
    ranked = None if evaluation is None else {f"eval_{k}": v for k, v in evaluation.items()}
    if self.best_metric and ranked is None:
      ranked = {f"eval_{self.best_metric}": float("nan")}
    self.ckpt.wait_until_finished()  # a failed previous write is reported first, naming it
    self.writer.flush()  # metrics up to a checkpoint reach object storage with it
    self.save(state, ranked)

  def save(self, state, metrics: dict | None = None, wait: bool = False) -> int:
    """Writes the state's step unless it exists (with `wait`: and waits for the write);
    returns the step."""
    host = self.runner.host_state(state)
    step = int(jax.device_get(host.step))
    if step not in self.ckpt.all_steps():
      data_state = self.train_iter.get_state()
      self.ckpt.save(step, host, data_state=data_state, config=self.config, metrics=metrics)
    if wait:
      self.ckpt.wait_until_finished()
    return step


@dataclasses.dataclass
class Actions:
  """The periodic actions of one run, in the order the loop calls them after an update."""

  throughput: Throughput
  nonfinite: NonFinite
  log: Log
  evaluation: Evaluate
  save: Save
  profile: telemetry.ProfileWindow


def for_run(
  s: Setup,
  config: Any,
  workdir: str,
  start: int,
  ckpt: CheckpointManager,
  writer: MetricWriter,
  should_stop_evaluation: Callable[[], bool],
  flops_per_count: float = 0.0,
  peak_flops: float | None = None,
) -> Actions:
  """The actions of a run built by `setup.build` (`s`) that continues after update `start`:
  logging to `writer`, evaluating (abandoned when `should_stop_evaluation()`), saving to
  `ckpt` (with `config`), counting NaN/Inf updates, and the profile window."""
  exp, runner, loop = s.exp, s.runner, s.exp.loop

  def view(state) -> Run:  # the model as the evaluators see it
    host = runner.host_state(state)
    step = int(jax.device_get(host.step))
    return Run(s.model, host.params, s.info, s.eval_factory, exp.eval.eval_batches, workdir, step)

  throughput = Throughput(exp.task)
  log = Log(
    every=loop.log_every,
    first=start + 1,
    total=loop.num_train_steps,
    writer=writer,
    throughput=throughput,
    runner=runner,
    skip_nonfinite=loop.skip_nonfinite,
    flops_per_count=flops_per_count,
    peak_flops=peak_flops,
    sources=s.info.sources,
  )
  evaluation = Evaluate(
    exp=exp,
    runner=runner,
    eval_factory=s.eval_factory,
    eval_batches_total=s.info.eval_batches,
    writer=writer,
    view=view,
    should_stop=should_stop_evaluation,
    sources=s.info.eval_sources,
  )
  save = Save(
    every=exp.checkpoint.checkpoint_every,
    total=loop.num_train_steps,
    best_metric=exp.checkpoint.best_metric,
    ckpt=ckpt,
    runner=runner,
    train_iter=s.train_iter,
    config=config,
    writer=writer,
  )
  return Actions(
    throughput=throughput,
    nonfinite=NonFinite(skip=loop.skip_nonfinite, runner=runner, ckpt=ckpt),
    log=log,
    evaluation=evaluation,
    save=save,
    profile=telemetry.ProfileWindow(
      workdir, exp.telemetry.profile_steps, start + 1, jax.process_index() == 0
    ),
  )
