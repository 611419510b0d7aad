"""Train-step throughput: baseline vs TaperNorm mid-taper vs the g = 0 fixed step, side by side in one process."""

import dataclasses
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tapernorm_jax import cpu_kernels, data
from tapernorm_jax.runtime import costs, hardware
from tapernorm_jax.benchmarks.timing import check_at_least, paired_ratio, seconds_per_batch
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.model import ModelConfig, param_count, sharding
from tapernorm_jax.taper.variants import SIZES
from tapernorm_jax.train import run_config
from tapernorm_jax.train.trainer import Trainer

CASES = (  # (label, variant, which step, train.cpu_paths: auto is what a run picks here; the others force one)
  ("baseline", "baseline", "train_step", "auto"),
  ("all_taper, 0 < g < 1", "all_taper", "train_step", "auto"),
  ("all_taper, g = 0 fixed step", "all_taper", "fixed_train_step", "auto"),
  ("baseline, CPU kernels", "baseline", "train_step", cpu_kernels.KERNELS),
  ("baseline, XLA's own products and attention", "baseline", "train_step", cpu_kernels.XLA),
)


@dataclasses.dataclass
class Settings:
  """Sizes, batch shape and how many steps are timed."""

  sizes: tuple[str, ...] = ("1m", "30m")
  batch: int = 16
  seq: int = 512
  steps: int = 5
  repeats: int = 5

  def __post_init__(self):
    unknown = [size for size in self.sizes if size not in SIZES]
    if unknown or not self.sizes:
      raise ValueError(f"sizes={','.join(self.sizes)}: choose from {', '.join(SIZES)}")
    check_at_least(self, 1, "batch", "seq", "steps", "repeats")


def make_trainer(
  variant: str,
  size: str,
  B: int,
  T: int,
  opt: dict[str, float] | None = None,
  cpu_paths: str = "auto",
  mesh: Any = None,
  dtype: str | None = None,
) -> Trainer:
  """A Trainer of `variant` at `size` on B × T batches, with optimiser hyperparameters `opt` overridden, its products
  and attention `cpu_paths` (auto: timed here, as a run does; train/kernel_choice.py), computing in `dtype` (None: the
  config's)."""
  cfg = run_config.get_config(variant, f"size={size}")
  cfg.model.T, cfg.train.batch_size = T, B
  if dtype is not None:
    cfg.model.dtype = dtype
  cfg.opt.update(opt or {})
  trainer = Trainer(cfg, mesh or sharding.make_mesh(), cpu_paths)
  trainer.choose_paths()
  return trainer


def mid_taper(trainer: Trainer, state: dict) -> dict:
  """`state` moved to the middle of the taper (0 < g < 1), where TaperNorm's step does the most work."""
  mid = (trainer.phases.taper_start + trainer.phases.taper_end) // 2
  return {**state, "step": jax.device_put(jnp.int32(mid), state["step"].sharding)}


def run_steps(step_fn, state, batch, steps: int) -> tuple[list[float], dict, dict]:
  """Runs `steps` steps, each timed to completion; returns (seconds per step, new state, last metrics)."""
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = step_fn(state, batch)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  return times, state, metrics


def bench_size(size: str, s: Settings, mesh) -> list[dict]:
  """All cases at one size, states placed mid-taper, timed in interleaved rounds; each case's speed relative to
  the baseline is the median (and min–max) over rounds of that round's ratio, and MFU is against `hardware.peak`."""
  cases, peak = [], hardware.peak()
  offered = cpu_kernels.training_paths(
    ModelConfig.from_config(run_config.get_config("baseline").model).for_devices(mesh), mesh
  )
  for label, variant, which, cpu_paths in CASES:
    if cpu_paths not in ("auto", *offered):
      continue  # a CPU kernel on another target
    trainer = make_trainer(variant, size, s.batch, s.seq, cpu_paths=cpu_paths, mesh=mesh)
    cfg = trainer.cfg
    state = mid_taper(trainer, trainer.init_state(0))
    batch = jax.device_put(
      np.random.default_rng(0).integers(0, cfg.model.V, (s.batch, s.seq + 1), dtype=np.int32), trainer.batch_sharding
    )
    step_fn = getattr(trainer, which)
    _, state, _ = run_steps(step_fn, state, batch, 1)  # compile and warm up
    flops = costs.train_flops_per_token(param_count(state["params"]), cfg.model.L, cfg.model.D, s.seq)
    cases.append(
      {
        "label": label,
        "fn": step_fn,
        "state": state,
        "batch": batch,
        "times": [],
        "rounds": [],
        "flops": flops,
        "paths": trainer.paths_choice.record(),
      }
    )
  for _ in range(s.repeats):  # interleaved, so machine noise hits every case alike
    for case in cases:
      seconds, case["state"], case["metrics"] = run_steps(case["fn"], case["state"], case["batch"], s.steps)
      case["times"] += seconds
      case["rounds"].append(statistics.mean(seconds))
  rows = []
  for case in cases:
    med = statistics.median(case["times"])
    tokens_per_s = s.batch * s.seq / med
    rows.append(
      {
        "size": size,
        "case": case["label"],
        "paths": case["paths"],
        "gate": float(case["metrics"]["gate"]),
        "step_s": med,
        "spread_s": float(np.subtract(*np.percentile(case["times"], [75, 25]))),
        "tokens_per_s": tokens_per_s,
        "compilations": case["fn"]._cache_size(),
        "flops_per_token": case["flops"],
        "vs_baseline": paired_ratio(case["rounds"], cases[0]["rounds"]),
        "mfu": costs.mfu(tokens_per_s, case["flops"], peak and peak["flops"]),
      }
    )
    print(
      f"{size:>4} {case['label']:<28} gate={rows[-1]['gate']:.3f} {med * 1e3:9.1f} ms/step "
      f"{tokens_per_s:10.0f} tok/s ({rows[-1]['vs_baseline']['median']:.3f}× baseline)",
      flush=True,
    )
  return rows


def loader_seconds_per_batch(seq: int, batch: int, n: int = 200) -> float:
  """Seconds per batch of the data loader alone (offline corpus, CPU-preset vocabulary)."""
  cfg = run_config.get_config("baseline")
  cfg.model.T = seq
  prepared = data.prepare(cfg.data)
  it = data.train_iterator(prepared, batch_size=batch, seq_len=seq, seed=0, process_index=0, process_count=1)
  return seconds_per_batch(it, n)


def run(s: Settings) -> dict[str, Any]:
  """Every size and case, and the loader alone."""
  mesh = sharding.make_mesh()
  rows = [row for size in s.sizes for row in bench_size(size, s, mesh)]
  peak = hardware.peak()
  return {
    "hardware": hardware.describe(),
    "settings": dataclasses.asdict(s),
    "rows": rows,
    "loader_s_per_batch": loader_seconds_per_batch(s.seq, s.batch),
    "peak": peak,
  }


def markdown(results: dict[str, Any]) -> str:
  """The table of step times, ratios to the baseline (round by round), MFU, and the loader's share of a step."""
  s, rows, loader_s = results["settings"], results["rows"], results["loader_s_per_batch"]
  ratio = lambda r: f"{r['median']:.3f}× ({r['min']:.3f}–{r['max']:.3f})"
  table = markdown_table(
    ["size", "step", "paths", "gate", "ms/step", "tokens/s", "vs baseline", "MFU"],
    [
      [
        r["size"],
        r["case"],
        f"{r['paths']['name']} ({r['paths']['how']})",
        f"{r['gate']:.2f}",
        f"{r['step_s'] * 1e3:.1f} ± {r['spread_s'] * 1e3:.1f}",
        f"{r['tokens_per_s']:.0f}",
        ratio(r["vs_baseline"]),
        "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
      ]
      for r in rows
    ],
  )
  slowest_share = max(loader_s / (loader_s + r["step_s"]) for r in rows)
  peak = results.get("peak")
  return "\n".join(
    [
      f"Train-step throughput, {hardware.one_line(results['hardware'])}, batch {s['batch']} × {s['seq']} tokens, "
      f"median (± interquartile range) of {s['repeats']} interleaved rounds × {s['steps']} steps; vs baseline: "
      "median (min–max) over the rounds of each round's ratio of speeds",
      "",
      table,
      "",
      f"Data loader alone: {loader_s * 1e3:.2f} ms/batch ({s['batch'] * s['seq'] / loader_s:,.0f} tokens/s); at "
      f"most {100 * slowest_share:.2f}% of a step waiting for data (in-thread loading). MFU: 6·N + 12·L·D·T "
      f"FLOPs per token against {peak['source'] if peak else 'no known peak (n/a)'}.",
    ]
  )
