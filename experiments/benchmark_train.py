"""Train-step throughput: baseline vs TaperNorm mid-taper vs the g = 0 fast step, side by side in one process.

    python -m experiments.benchmark_train [--sizes=1m,30m] [--batch=16] [--seq=512] [--repeats=5]

Also times the data loader alone on the offline corpus, to report the share of a step spent
waiting for data. Prints a markdown table and writes JSON + markdown under --out.
"""

import json
import os
import platform
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from configs import base
from tapernorm_jax import data, sharding
from tapernorm_jax.train import Trainer

_SIZES = flags.DEFINE_list("sizes", ["1m", "30m"], "Model sizes (configs/base.py SIZES).")
_BATCH = flags.DEFINE_integer("batch", 16, "Global batch size.")
_SEQ = flags.DEFINE_integer("seq", 512, "Sequence length T.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Repeats (median and spread reported).")
_OUT = flags.DEFINE_string("out", "runs/benchmark_train", "Output directory.")

CASES = (  # (label, variant, which step)
    ("baseline", "baseline", "train_step"),
    ("all_taper, 0 < g < 1", "all_taper", "train_step"),
    ("all_taper, g = 0 fast step", "all_taper", "fast_train_step"),
)


def run_steps(step_fn, state, batch, steps: int) -> tuple[list[float], dict, dict]:
  """Runs `steps` steps, each timed to completion; returns (seconds per step, new state, last metrics)."""
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = step_fn(state, batch)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  return times, state, metrics


def bench_size(size: str, mesh) -> list[dict]:
  """All cases at one size, states placed mid-taper, timed in interleaved rounds."""
  cases = []
  for label, variant, which in CASES:
    cfg = base.get_config(variant, f"size={size}")
    cfg.model.T = _SEQ.value
    cfg.train.batch_size = _BATCH.value
    trainer = Trainer(cfg, mesh)
    state = trainer.init_state(0)
    mid = (trainer.phases.taper_start + trainer.phases.taper_end) // 2
    state["step"] = jax.device_put(jnp.int32(mid), state["step"].sharding)
    batch = jax.device_put(np.random.default_rng(0).integers(0, cfg.model.V, (_BATCH.value, _SEQ.value + 1),
                                                             dtype=np.int32), trainer.batch_sharding)
    step_fn = getattr(trainer, which)
    _, state, _ = run_steps(step_fn, state, batch, 1)  # compile and warm up
    cases.append({"label": label, "fn": step_fn, "state": state, "batch": batch, "times": []})
  for _ in range(_REPEATS.value):  # interleaved, so machine noise hits every case alike
    for case in cases:
      seconds, case["state"], case["metrics"] = run_steps(case["fn"], case["state"], case["batch"], _STEPS.value)
      case["times"] += seconds
  rows = []
  for case in cases:
    med = statistics.median(case["times"])
    rows.append({"size": size, "case": case["label"], "gate": float(case["metrics"]["gate"]), "step_s": med,
                 "spread_s": float(np.subtract(*np.percentile(case["times"], [75, 25]))), "tokens_per_s": _BATCH.value * _SEQ.value / med,
                 "compilations": case["fn"]._cache_size(), "vs_baseline": None})
    rows[-1]["vs_baseline"] = rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    print(f"{size:>4} {case['label']:<28} gate={rows[-1]['gate']:.3f} {med * 1e3:9.1f} ms/step "
          f"{rows[-1]['tokens_per_s']:10.0f} tok/s ({rows[-1]['vs_baseline']:.3f}× baseline)", flush=True)
  return rows


def loader_rate(seq: int, batch: int, n: int = 200) -> float:
  """Seconds per batch of the data loader alone (offline corpus, CPU-preset vocab)."""
  cfg = base.get_config("baseline")
  cfg.model.T = seq
  prepared = data.prepare(cfg.data)
  it = data.train_iterator(prepared, batch_size=batch, seq_len=seq, seed=0, process_index=0, process_count=1)
  next(it)
  t0 = time.perf_counter()
  for _ in range(n):
    next(it)
  return (time.perf_counter() - t0) / n


def main(argv: list[str]) -> None:
  """Runs every size and case, prints and saves the table."""
  del argv
  mesh = sharding.make_mesh()
  hardware = f"{jax.devices()[0].device_kind} × {jax.device_count()} ({platform.processor() or platform.machine()}, " \
             f"{os.cpu_count()} cores)"
  rows = [row for size in _SIZES.value for row in bench_size(size, mesh)]
  loader_s = loader_rate(_SEQ.value, _BATCH.value)
  lines = [f"Train-step throughput, {hardware}, batch {_BATCH.value} × {_SEQ.value} tokens, "
           f"median (± interquartile range) of {_REPEATS.value} interleaved rounds × {_STEPS.value} steps", "",
           "| size | step | gate | ms/step | tokens/s | vs baseline |", "|---|---|---|---|---|---|"]
  lines += [f"| {r['size']} | {r['case']} | {r['gate']:.2f} | {r['step_s'] * 1e3:.1f} ± {r['spread_s'] * 1e3:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['vs_baseline']:.3f}× |" for r in rows]
  slowest_share = max(loader_s / (loader_s + r["step_s"]) for r in rows)
  lines += ["", f"Data loader alone: {loader_s * 1e3:.2f} ms/batch ({_BATCH.value * _SEQ.value / loader_s:,.0f} "
            f"tokens/s); at most {100 * slowest_share:.2f}% of a step waiting for data (in-thread loading)."]
  table = "\n".join(lines)
  print("\n" + table)
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "results.json"), "w") as f:
    json.dump({"hardware": hardware, "batch": _BATCH.value, "seq": _SEQ.value, "rows": rows,
               "loader_s_per_batch": loader_s}, f, indent=2)
  with open(os.path.join(_OUT.value, "table.md"), "w") as f:
    f.write(table + "\n")


if __name__ == "__main__":
  app.run(main)
