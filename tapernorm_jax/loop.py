"""The training loop: data, resume, the compiled steps, metrics, checkpoints, evaluation and results."""

import json
import math
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from tapernorm_jax import data, sharding
from tapernorm_jax.checkpoint import Checkpointer
from tapernorm_jax.metrics import MetricsWriter, read_jsonl
from tapernorm_jax.model import param_count
from tapernorm_jax.train import State, Trainer


def log(message: str) -> None:
  """Prints on the first process, without breaking the progress bar."""
  if jax.process_index() == 0:
    tqdm.write(message)


def write_json_atomically(path: str, obj: Any) -> None:
  """Writes JSON to a temporary file and renames it, so a reader never sees half a file."""
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def check_or_write_config(workdir: str, cfg: ml_collections.ConfigDict) -> None:
  """Saves the resolved config; on resume, refuses a model that differs from the one in `workdir`."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    differing = {k: (saved["model"].get(k), v) for k, v in cfg.model.to_dict().items() if saved["model"].get(k) != v}
    if differing:
      raise ValueError(f"--workdir={workdir} holds a run whose model config differs: "
                       + ", ".join(f"model.{k}: saved {a!r} vs now {b!r}" for k, (a, b) in differing.items())
                       + ". Use a new --workdir, or the saved config to resume.")
  if jax.process_index() == 0:
    write_json_atomically(path, json.loads(cfg.to_json_best_effort()))


def truncate_metrics(path: str, step: int) -> None:
  """Drops records after `step` (left by a run that died after its last checkpoint)."""
  if os.path.exists(path) and jax.process_index() == 0:
    kept = [r for r in read_jsonl(path) if r["step"] < step]
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, path)


def global_batch(trainer: Trainer, local_BxT1: np.ndarray) -> jax.Array:
  """Assembles the per-process rows into one batch sharded over the mesh."""
  return jax.make_array_from_process_local_data(trainer.batch_sharding, np.asarray(local_BxT1, np.int32))


def evaluate(trainer: Trainer, state: State, batches: list[jax.Array]) -> float:
  """Mean validation cross-entropy at g = 0."""
  return float(np.mean(jax.device_get([trainer.eval_step(state, b) for b in batches])))


def run(cfg: ml_collections.ConfigDict, workdir: str, *, stop_after: int | None = None,
        devices: list | None = None) -> dict[str, Any]:
  """Trains (or resumes) the run in `workdir`; returns the results also written to `results.json`."""
  t_start = time.time()
  workdir = os.path.abspath(os.path.expanduser(workdir))
  mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, devices)
  trainer = Trainer(cfg, mesh)  # validates the config before anything compiles
  os.makedirs(workdir, exist_ok=True)
  check_or_write_config(workdir, cfg)
  prepared = data.prepare(cfg.data)
  T, B, steps = cfg.model.T, cfg.train.batch_size, cfg.train.steps
  train_it = data.train_iterator(prepared, batch_size=B, seq_len=T, seed=cfg.seed)
  pi, pc = jax.process_index(), jax.process_count()
  eval_batches = [global_batch(trainer, b[pi * (B // pc):(pi + 1) * (B // pc)])
                  for b in data.eval_batches(prepared, B, T, cfg.train.eval_batches)]

  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep=cfg.checkpoint.keep)
  start = ckpt.latest_step() or 0
  if start:
    log(f"resuming from the checkpoint at step {start} in {ckpt.directory}")
    state, data_state = ckpt.restore(start, trainer.abstract_state())
    train_it.set_state(data_state)
  else:
    state = trainer.init_state(cfg.seed)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  truncate_metrics(metrics_path, start)
  writer = MetricsWriter(workdir)
  log(f"{cfg.variant} on {prepared.name}: {param_count(state['params']):,} parameters, {mesh.size} "
      f"{jax.default_backend()} devices, writing to {workdir}")

  pending: list[tuple[int, dict]] = []
  val_loss = {"step": -1, "value": math.nan}
  clock = {"t": time.time(), "wait": 0.0, "steps": 0}
  bar = tqdm(total=steps, initial=start, disable=pi != 0, mininterval=1.0, dynamic_ncols=True,
             desc=f"{cfg.variant} [{prepared.name}]")

  def flush() -> None:
    """Fetches pending step metrics, stops on a non-finite loss, writes the records."""
    records = jax.device_get(pending)
    pending.clear()
    elapsed = max(time.time() - clock["t"], 1e-9)
    rate = {"tokens_per_s": clock["steps"] * B * T / elapsed, "data_wait_frac": clock["wait"] / elapsed}
    clock.update(t=time.time(), wait=0.0, steps=0)
    for step, m in records:
      if not math.isfinite(float(m["loss"])):
        ckpt.wait()
        last = ckpt.latest_step()
        where = f"step {last} in {ckpt.directory}" if last else "none (no checkpoint was saved yet)"
        raise FloatingPointError(f"loss is {float(m['loss'])} at step {step}; stopping. Last good checkpoint: "
                                 f"{where}. Lower --config.opt.lr or check the data, then re-run to resume.")
      writer.write(step, {**m, **rate})
    if records:
      m = records[-1][1]
      bar.set_postfix(loss=f"{float(m['loss']):.4f}", gate=f"{float(m['gate']):.3f}",
                      tok_s=f"{rate['tokens_per_s']:.0f}", refresh=False)

  for k in range(start, steps):
    t0 = time.time()
    batch = global_batch(trainer, next(train_it))
    clock["wait"] += time.time() - t0
    step_fn = trainer.fast_train_step if trainer.uses_fast_step(k) else trainer.train_step
    state, metrics = step_fn(state, batch)
    clock["steps"] += 1
    done = k + 1
    if done % cfg.train.diag_every == 0 or done == steps:
      val_loss = {"step": done, "value": evaluate(trainer, state, eval_batches)}
      metrics = {**metrics, **trainer.diagnostics(state, batch), "val_loss": val_loss["value"]}
    pending.append((k, metrics))
    bar.update(1)
    stopping = stop_after is not None and done >= stop_after
    if done % cfg.train.log_every == 0 or done % cfg.checkpoint.every == 0 or done == steps or stopping:
      flush()
    if done % cfg.checkpoint.every == 0 or done == steps or stopping:
      ckpt.save(done, state, train_it.get_state())
    if stopping:
      break
  flush()
  bar.close()
  ckpt.close()
  writer.close()
  done = int(jax.device_get(state["step"]))
  if val_loss["step"] != done:
    val_loss = {"step": done, "value": evaluate(trainer, state, eval_batches)}
  results = {
      "variant": cfg.variant, "size": cfg.size, "seed": cfg.seed, "corpus": prepared.name,
      "aux_weight": cfg.taper.aux_weight, "steps": done, "tokens": done * B * T,
      "final_val_loss": val_loss["value"], "val_gate": 0.0,
      "val_tokens": len(eval_batches) * B * T, "params": param_count(state["params"]),
      "wall_time_s": time.time() - t_start, "resumed_from": start, "devices": mesh.size,
      "backend": jax.default_backend(), "complete": done >= steps,
  }
  if pi == 0 and results["complete"]:
    write_json_atomically(os.path.join(workdir, "results.json"), results)
  return results
