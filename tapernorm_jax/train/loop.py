"""The training loop, in parts a reader can name: resume, step reporting, profiling, results (the run directory's
files: `run_dir.py`).

    run(cfg, workdir)   train (or resume) one run and write its results
    restore_or_init     the latest complete checkpoint (or, with checkpoint.on_damaged=fallback, the newest one
                        that restores), or a fresh state
    StepReporter        reads each step's metrics one step behind, writes them, stops on a non-finite loss
    Profiler            a jax.profiler trace of `train.profile_steps` steps into <workdir>/profile

The workdir may be local or a URL (`--workdir=gs://bucket/run`): run-directory files go through `run_files.workdir_path`
(etils.epath), checkpoints through Orbax, metrics and TensorBoard events through `metrics.MetricsWriter`.
"""

import contextlib
import math
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from etils import epath
from tqdm import tqdm

from tapernorm_jax import data
from tapernorm_jax.runtime import allocator, compilation_cache, costs, hardware
from tapernorm_jax.storage import directory_lock, run_files, orbax_log
from tapernorm_jax.data import unigram
from tapernorm_jax.hf import pretrained
from tapernorm_jax.model import param_count, sharding
from tapernorm_jax.taper import methods
from tapernorm_jax.train import processes, tracking
from tapernorm_jax.train.checkpoint import Checkpointer
from tapernorm_jax.train.metrics import MetricsWriter
from tapernorm_jax.train.run_dir import PATHS_FILE, RESULTS_SCHEMA, RunDir, log
from tapernorm_jax.train.trainer import State, Trainer


def restore_or_init(trainer: Trainer, ckpt: Checkpointer, cfg: ml_collections.ConfigDict) -> tuple[State, int, Any]:
  """(state, step, data state) of the latest complete checkpoint, or a fresh state at step 0 (data state None):
  random, or the pretrained Hugging Face GPT-2 that `cfg.init_from` names."""
  fallback = cfg.checkpoint.get("on_damaged", "stop") == "fallback"
  restored = ckpt.restore_latest(trainer.abstract_state(), fallback=fallback)
  if restored is not None:
    for step, reason, path in restored.moved:
      log(f"the checkpoint at step {step} is damaged ({reason}); moved it aside to {path}")
    log(f"resuming from the checkpoint at step {restored.step} in {ckpt.directory}")
    return restored.state, restored.step, restored.data_state
  if cfg.get("init_from"):
    params = pretrained.load(cfg.init_from, trainer.model_cfg)
    log(f"starting from the pretrained model {cfg.init_from}")
    return trainer.state_from_params(params), 0, None
  return trainer.init_state(cfg.seed), 0, None


class StepReporter:
  """Step metrics read one step behind (step k is fetched once step k + 1 is dispatched), so the host never idles
  the device; writes every record, updates the progress bar, stops on a non-finite loss."""

  def __init__(
    self, writer: MetricsWriter, ckpt: Checkpointer, bar: tqdm, tokens_per_step: int, log_every: int, started: float
  ):
    self.writer, self.ckpt, self.bar = writer, ckpt, bar
    self.tokens_per_step, self.log_every = tokens_per_step, log_every
    self.pending: list[tuple[int, dict]] = []
    self.last_read, self.last_cpu, self.started = time.time(), time.process_time(), started
    self.first_step_s: float | None = None  # from the run's start to its first step's metrics (compiling included)
    self.data_wait_s = 0.0
    self.rates: list[float] = []  # tokens/s of each step read

  def push(self, step: int, metrics: dict) -> None:
    """Queues step `step`'s (device) metrics and reads every queued step but the newest."""
    self.pending.append((step, metrics))
    while len(self.pending) > 1:
      self._read(*self.pending.pop(0))

  def drain(self) -> None:
    """Reads every queued step (before a checkpoint, so a non-finite step is never saved)."""
    while self.pending:
      self._read(*self.pending.pop(0))

  def _read(self, step: int, metrics: dict) -> None:
    m = jax.device_get(metrics)
    now = time.time()
    if self.first_step_s is None:
      self.first_step_s = now - self.started
      log(f"first step done {self.first_step_s:.1f} s after the start (compiling included)")
    elapsed, cpu = max(now - self.last_read, 1e-9), time.process_time()
    rate = {
      "tokens_per_s": self.tokens_per_step / elapsed,
      "data_wait_frac": min(self.data_wait_s / elapsed, 1.0),
      "host_rss_mb": hardware.resident_mb(),
      "host_cpu_s": cpu - self.last_cpu,
    }
    self.last_read, self.last_cpu, self.data_wait_s = now, cpu, 0.0
    self.rates.append(rate["tokens_per_s"])
    loss = float(m["loss"])
    if not math.isfinite(loss):
      self.ckpt.wait()
      last = self.ckpt.latest_step()
      where = f"step {last} in {self.ckpt.directory}" if last else "none (no checkpoint was saved yet)"
      self.writer.flush()  # the records before this step, uploaded in a remote run directory
      raise FloatingPointError(
        f"loss is {loss} at step {step}; stopping. Last good checkpoint: {where}. Lower "
        "--config.opt.lr or check the data, then re-run to resume."
      )
    self.writer.write(step, {**m, **rate})
    self.bar.update(1)
    if (step + 1) % self.log_every == 0:
      self.bar.set_postfix(
        loss=f"{loss:.4f}", gate=f"{float(m['gate']):.3f}", tok_s=f"{rate['tokens_per_s']:.0f}", refresh=False
      )


class Profiler:
  """Traces steps [start, start + count) with jax.profiler into `directory` (count 0: off); a remote directory gets
  the trace through a local `run_files.Mirror`, uploaded when it stops."""

  def __init__(self, directory: epath.Path, start: int, count: int):
    self.directory, self.start, self.stop = directory, start, start + count
    self.active = False
    self.mirror: run_files.Mirror | None = None

  def before_step(self, step: int) -> None:
    """Starts the trace at the first traced step."""
    if step == self.start and self.stop > self.start:
      self.mirror = run_files.Mirror(self.directory) if run_files.is_url(self.directory) else None
      jax.profiler.start_trace(os.fspath(self.mirror.local if self.mirror else self.directory))
      self.active = True

  def after_step(self, step: int, state: State) -> None:
    """Stops the trace after the last traced step has finished on the device."""
    if self.active and step + 1 >= self.stop:
      jax.block_until_ready(state)
      jax.profiler.stop_trace()
      if self.mirror:
        self.mirror.close()
      self.active = False
      log(f"profile of steps {self.start}–{self.stop - 1} written to {self.directory}")


def global_batch(trainer: Trainer, local_BxT1: np.ndarray) -> jax.Array:
  """Assembles the per-process rows into one batch sharded over the mesh."""
  return jax.make_array_from_process_local_data(trainer.batch_sharding, np.asarray(local_BxT1, np.int32))


def evaluate(trainer: Trainer, state: State, sets: dict[str, list[jax.Array]]) -> dict[str, Any]:
  """Mean cross-entropy of each evaluation set (`val`: the corpus's validation split) and the gate it was taken at:
  0 (the g = 0 model) once every gate is 0 for good, before that the gates the model trains at."""
  gate = trainer.eval_gate(int(jax.device_get(state["step"])))
  step_fn = trainer.eval_step if gate == 0.0 else trainer.eval_gated_step
  return {
    "gate": gate,
    "losses": {
      name: float(np.mean(jax.device_get([step_fn(state, b) for b in batches]))) for name, batches in sets.items()
    },
  }


def eval_metrics(evaluated: dict[str, Any]) -> dict[str, float]:
  """`val_loss` and `eval/<name>` for the other sets, and `val_gate`, the mean gate they were taken at."""
  return {
    **{"val_loss" if name == "val" else f"eval/{name}": value for name, value in evaluated["losses"].items()},
    "val_gate": evaluated["gate"],
  }


def evaluation_batches(
  trainer: Trainer, cfg: ml_collections.ConfigDict, prepared: data.Prepared
) -> dict[str, list[jax.Array]]:
  """This process's rows of the fixed evaluation windows: `val` (the corpus's validation split), `tune` (the train
  stream's held-out tail, with data.tune_frac > 0) and each eval set."""
  B, T, n_eval = cfg.train.batch_size, cfg.model.T, cfg.train.eval_batches
  pi, pc = jax.process_index(), jax.process_count()
  windows = {
    "val": data.eval_batches(prepared, B, T, n_eval),
    **({"tune": data.eval_batches(prepared, B, T, n_eval, "tune")} if "tune" in prepared.streams else {}),
    **{
      name: data.eval_windows(tokens, B, T, n_eval, name=name)
      for name, tokens in data.eval_sets(cfg.data, prepared).items()
    },
  }
  return {
    name: [global_batch(trainer, b[pi * (B // pc) : (pi + 1) * (B // pc)]) for b in batches]
    for name, batches in windows.items()
  }


def results_of(cfg: ml_collections.ConfigDict, corpus: str, state: State, evaluated: dict[str, Any]) -> dict[str, Any]:
  """What results.json says of a run whatever the machine: its identity, progress and final losses (at g = 0 once
  the gates have reached it: `val_gate`)."""
  losses = evaluated["losses"]
  B, T, done = cfg.train.batch_size, cfg.model.T, int(jax.device_get(state["step"]))
  return {
    "schema": RESULTS_SCHEMA,
    "variant": cfg.variant,
    "size": cfg.size,
    "seed": cfg.seed,
    "corpus": corpus,
    "scale_loss_weight": methods.scale_loss_weight(cfg),
    "steps": done,
    "tokens": done * B * T,
    "final_val_loss": losses["val"],
    "eval_losses": losses,
    "val_gate": evaluated["gate"],
    "val_tokens": cfg.train.eval_batches * B * T,
    "params": param_count(state["params"]),
    "method": methods.name(cfg),
    "init_from": cfg.get("init_from", ""),
    "complete": done >= cfg.train.steps,
  }


def throughput(cfg: ml_collections.ConfigDict, params: int, rates: list[float]) -> dict[str, Any]:
  """Steady tokens/s (the median over the run's logged steps), FLOPs per token (6·N + 12·L·D·T), the devices' peak
  FLOP/s (`hardware.peak`: a data sheet's, or on CPUs a measured GEMM rate) and the model FLOPs utilisation."""
  steady = rates[1:] or rates  # the first step read includes compiling
  tokens_per_s = float(np.median(steady)) if steady else None
  flops = costs.train_flops_per_token(params, cfg.model.L, cfg.model.D, cfg.model.T)
  peak = hardware.peak()
  return {
    "tokens_per_s": tokens_per_s,
    "flops_per_token": flops,
    "peak_flops": peak and peak["flops"],
    "peak_source": peak and peak["source"],
    "mfu": costs.mfu(tokens_per_s, flops, peak and peak["flops"]),
  }


def train_steps(
  trainer: Trainer,
  state: State,
  start: int,
  train_it: Any,
  eval_sets: dict[str, list[jax.Array]],
  reporter: StepReporter,
  profiler: Profiler,
  stop_after: int | None,
) -> tuple[State, dict[str, Any]]:
  """Steps `start`… to the end (or `stop_after`): evaluation and diagnostics every `train.diag_every`, checkpoints
  every `checkpoint.every` and at the end; returns the state and the last evaluation ({"step", "losses"})."""
  cfg, steps = trainer.cfg, trainer.cfg.train.steps
  evaluated = {"step": -1, "gate": 0.0, "losses": {}}
  for k in range(start, steps):
    processes.at_step(k, reporter.ckpt.directory)  # named if another process is lost (multi-process runs)
    t0 = time.time()
    batch = global_batch(trainer, next(train_it))
    reporter.data_wait_s += time.time() - t0
    profiler.before_step(k)
    step_fn = trainer.fixed_train_step if trainer.uses_fixed_step(k) else trainer.train_step
    state, metrics = step_fn(state, batch)
    done = k + 1
    if done % cfg.train.diag_every == 0 or done == steps:
      evaluated = {"step": done, **evaluate(trainer, state, eval_sets)}
      metrics = {**metrics, **trainer.diagnostics(state, batch), **eval_metrics(evaluated)}
    reporter.push(k, metrics)
    profiler.after_step(k, state)
    stopping = stop_after is not None and done >= stop_after
    if done % cfg.checkpoint.every == 0 or done == steps or stopping:
      reporter.drain()
      reporter.ckpt.save(done, state, train_it.get_state())
      reporter.writer.flush()
    if stopping:
      break
  return state, evaluated


def run(
  cfg: ml_collections.ConfigDict,
  workdir: str | os.PathLike,
  *,
  stop_after: int | None = None,
  devices: list | None = None,
) -> dict[str, Any]:
  """Trains (or resumes) the run in `workdir`; returns the results also written to `results.json`."""
  t_start = time.time()
  rundir = RunDir(workdir)
  compilation_cache.use(cfg.train.get("compilation_cache", "auto"))  # before anything of the run compiles
  mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, devices)
  rundir.check_config(cfg)
  started = rundir.started_paths() if cfg.train.get("cpu_paths", "auto") == "auto" else None
  trainer = Trainer(cfg, mesh, started)  # validates the config before anything compiles
  if started:
    log(f"resuming with the CPU paths this run started with: {started} ({PATHS_FILE})")
  with directory_lock.hold(rundir.path, "--workdir") if rundir.writer else contextlib.nullcontext([]) as removed:
    if removed:
      log(f"removed {len(removed)} temporary files left by writers that are gone: {', '.join(removed)}")
    trainer.choose_paths()  # times the CPU paths where auto has no cached choice: once the directory is held
    with orbax_log.to_file(rundir.log_file()):  # Orbax's writer threads' tracebacks: not the terminal's
      return train_run(cfg, rundir, trainer, mesh, stop_after, t_start)


def train_run(
  cfg: ml_collections.ConfigDict,
  rundir: RunDir,
  trainer: Trainer,
  mesh: jax.sharding.Mesh,
  stop_after: int | None,
  t_start: float,
) -> dict[str, Any]:
  """`run` once the run directory is held: restore or initialise, train, evaluate, write the results."""
  rundir.path.mkdir(parents=True, exist_ok=True)
  ckpt = Checkpointer(rundir.file("checkpoints"), keep=cfg.checkpoint.keep)
  state, start, data_state = restore_or_init(trainer, ckpt, cfg)  # before the data: a damaged checkpoint fails fast
  rundir.write_config(cfg)
  rundir.write_paths(trainer.paths_choice.record())
  prepared = data.prepare(cfg.data)
  T, B, steps = cfg.model.T, cfg.train.batch_size, cfg.train.steps
  train_it = data.train_iterator(prepared, batch_size=B, seq_len=T, seed=cfg.seed)
  if data_state is not None:
    train_it.set_state(data_state)
  eval_sets = evaluation_batches(trainer, cfg, prepared)
  reference = unigram.reference(
    prepared.tokens("train"), data.eval_batches(prepared, B, T, cfg.train.eval_batches), prepared.vocab_size
  )  # before training: unseen validation ids are named at the start
  if warning := unigram.unseen_warning(reference, cfg.train.eval_batches * B * T, prepared.name, prepared.vocab_size):
    log(f"warning: {warning}")
  rundir.truncate_metrics(start)
  writer = MetricsWriter(rundir.path, trackers=tracking.trackers(cfg, rundir.path) if jax.process_index() == 0 else ())
  log(
    f"{cfg.variant} on {prepared.name}: {param_count(state['params']):,} parameters, {mesh.size} "
    f"{jax.default_backend()} devices, writing to {rundir.path}"
  )
  bar = tqdm(
    total=steps,
    initial=start,
    disable=jax.process_index() != 0,
    mininterval=1.0,
    dynamic_ncols=True,
    desc=f"{cfg.variant} [{prepared.name}]",
  )
  reporter = StepReporter(writer, ckpt, bar, B * T, cfg.train.log_every, t_start)
  profiler = Profiler(rundir.file("profile"), cfg.train.profile_start, cfg.train.profile_steps)
  state, evaluated = train_steps(trainer, state, start, train_it, eval_sets, reporter, profiler, stop_after)
  reporter.drain()
  bar.close()
  ckpt.close()
  writer.close()
  done = int(jax.device_get(state["step"]))
  if evaluated["step"] != done:
    evaluated = {"step": done, **evaluate(trainer, state, eval_sets)}
  results = {
    **results_of(cfg, prepared.name, state, evaluated),
    "wall_time_s": time.time() - t_start,
    **reference,
    "resumed_from": start,
    "time_to_first_step_s": reporter.first_step_s,
    "devices": mesh.size,
    "backend": jax.default_backend(),
    "device_kind": mesh.devices.flat[0].device_kind,
    "cpu_identity": hardware.cpu_identity(),  # the host's exact CPU: a study's runs may come from several hosts
    "cpu_paths": trainer.paths_choice.record(),
    "malloc": allocator.in_effect(),
    **throughput(cfg, param_count(state["params"]), reporter.rates),
  }
  if results["complete"]:
    rundir.write_results(results)
  return results
