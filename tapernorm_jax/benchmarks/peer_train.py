"""This project's train step next to a peer's (Hugging Face Llama + torch AdamW) on the same initial weights.

`python -m experiments.benchmark_peer --modes=train` times, per cell (size, batch × T), one full
optimiser step — forward, backward, global-norm clipping, AdamW — of this project's `baseline` and
of TaperNorm (`all_taper`) mid-taper, against the peer's eager and `torch.compile`d steps. The
peer loads the baseline's initial weights (written as a Llama checkpoint) and must agree on the
first step's loss before anything is timed. Contenders run round-robin (`timing.time_interleaved`);
every ratio is taken round by round (`timing.paired_ratio`), so load drifts slower than a round
cancel. This module needs no PyTorch: the peer comes in through `TrainPeer`.
"""

import re
from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np

from tapernorm_jax import hardware
from tapernorm_jax.benchmarks import train as train_bench
from tapernorm_jax.benchmarks.timing import paired_ratio, summary, time_interleaved
from tapernorm_jax.errors import UserError
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.model import param_count
from tapernorm_jax.taper.variants import SIZES
from tapernorm_jax.train.trainer import Trainer

PyTree = Any
CELLS = ("1m:16x512", "9m:4x512", "30m:1x512")  # the grid: a step of about the same cost on 2 cores
OURS = {"baseline": "baseline", "taper": "all_taper"}  # contender → variant
LABELS = {"hf_eager": "HF eager", "hf_compiled": "HF torch.compile", "baseline": "ours baseline",
          "taper": "ours all_taper, 0 < g < 1"}
LOSS_TOLERANCE = 1e-4  # relative difference of the first step's loss, float32


class LossMismatchError(UserError, ValueError):
  """The peer's first loss is not ours on the same weights and batch: a timing would compare two computations."""


class TrainPeer(Protocol):
  """The other implementation's train step on one model, built from a Llama checkpoint directory."""

  def train_calls(self, batch_BxT1: np.ndarray) -> dict[str, Callable[[], Any] | str]:
    """One optimiser step on `batch_BxT1` per contender (hf_eager, hf_compiled), or the reason it cannot run."""

  def first_loss(self, batch_BxT1: np.ndarray) -> float:
    """Mean next-token cross-entropy of the batch at the initial weights (no update)."""


def parse_cell(cell: str) -> tuple[str, int, int]:
  """`9m:4x512` → ("9m", 4, 512); ValueError naming the cell otherwise."""
  m = re.fullmatch(r"(\w+):(\d+)x(\d+)", cell)
  if not m or m.group(1) not in SIZES or int(m.group(2)) < 1 or int(m.group(3)) < 2:
    raise ValueError(f"train_cells: {cell!r} is not SIZE:BATCHxT with SIZE one of {', '.join(SIZES)} "
                     "(e.g. 9m:4x512)")
  return m.group(1), int(m.group(2)), int(m.group(3))


def our_calls(trainers: dict[str, Trainer], batch_BxT1: np.ndarray, seed: int) -> dict[str, Callable[[], Any]]:
  """One jitted train step per contender, each on its own state; TaperNorm's placed mid-taper (0 < g < 1)."""
  calls = {}
  for name, tr in trainers.items():
    state = train_bench.mid_taper(tr, tr.init_state(seed)) if name == "taper" else tr.init_state(seed)
    box, batch = [state], jax.device_put(batch_BxT1, tr.batch_sharding)

    def step(tr=tr, box=box, batch=batch):
      box[0], metrics = tr.train_step(box[0], batch)
      return metrics["loss"]

    calls[name] = step
  return calls


def check_loss(ours: float, theirs: float, tolerance: float = LOSS_TOLERANCE) -> dict[str, float]:
  """The two first losses and their relative difference; LossMismatchError above `tolerance`."""
  rel = abs(ours - theirs) / max(abs(ours), 1e-12)
  if not rel <= tolerance:
    raise LossMismatchError(f"the peer's first-step loss {theirs:.6f} differs from this project's {ours:.6f} by "
                            f"{rel:.2e} (tolerance {tolerance:g}): the Llama checkpoint is not the same model, so "
                            "no timing is reported")
  return {"ours": ours, "peer": theirs, "relative_difference": rel}


def bench_cell(cell: str, make_peer: Callable[[Trainer], TrainPeer], s: Any) -> dict[str, Any]:
  """One cell: the loss check, then every contender's step timed round-robin, with ratios and MFU."""
  size, B, T = parse_cell(cell)
  opt = {"lr": 1e-4}  # every contender's learning rate (the schedule's warm-up would start the peer at 0)
  trainers = {name: train_bench.make_trainer(variant, size, B, T, opt) for name, variant in OURS.items()}
  base = trainers["baseline"]
  batch_BxT1 = np.random.default_rng(s.seed).integers(0, base.model_cfg.V, (B, T + 1), dtype=np.int32)
  peer = make_peer(base)
  calls = our_calls(trainers, batch_BxT1, s.seed)
  loss = check_loss(float(calls["baseline"]()), peer.first_loss(batch_BxT1))
  calls = {**peer.train_calls(batch_BxT1), **calls}
  runnable = {name: fn for name, fn in calls.items() if callable(fn)}
  samples = time_interleaved(runnable, s.repeats, s.warmup, s.min_sample_s)
  params = param_count(base.abstract_state()["params"])
  flops = hardware.train_flops_per_token(params, base.model_cfg.L, base.model_cfg.D, T)
  peak = hardware.peak()
  contenders = {}
  for name, fn in calls.items():
    if name not in samples:
      contenders[name] = {"na": fn}
      continue
    contenders[name] = summary(samples[name], B * T)
    contenders[name]["mfu"] = hardware.mfu(contenders[name]["median"], flops, peak and peak["flops"])
  ratios = {f"{ours}/{other}": paired_ratio(samples[ours], samples[other])
            for ours in OURS for other in (*[n for n in runnable if n not in OURS], "baseline") if other != ours}
  row = {"cell": cell, "size": size, "B": B, "T": T, "params": params, "flops_per_token": flops, "loss": loss,
         "contenders": contenders, "ratios": ratios, "peak": peak}
  log_cell(row)
  return row


def log_cell(row: dict) -> None:
  """One line per cell: each contender's median tokens/s and the baseline's ratio to each peer contender."""
  c, r = row["contenders"], row["ratios"]
  cells = ", ".join(f"{LABELS[n]} " + (f"{x['median']:,.0f} tok/s" if "median" in x else "n/a") for n, x in c.items())
  ratios = ", ".join(f"{k} {v['median']:.2f}×" for k, v in r.items())
  print(f"train {row['cell']}: {cells}; {ratios}", flush=True)


def ratio_cell(row: dict, key: str) -> str:
  """`1.23× (1.10–1.31)`: the median and min–max over rounds of one round-by-round ratio, or `–`."""
  r = row["ratios"].get(key)
  return f"{r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})" if r else "–"


def markdown(rows: list[dict], repeats: int, min_sample_s: float) -> str:
  """The train table: tokens/s per contender, ours / HF round by round, TaperNorm / baseline, MFU."""
  tok = lambda x: f"{x['median']:,.0f}" if "median" in x else "n/a"
  table = [[r["size"], f"{r['B']} × {r['T']}", *(tok(r["contenders"].get(n, {})) for n in LABELS),
            ratio_cell(r, "baseline/hf_eager"), ratio_cell(r, "baseline/hf_compiled"),
            ratio_cell(r, "taper/baseline"), mfu_cell(r)] for r in rows]
  peak = next((r["peak"] for r in rows if r["peak"]), None)
  lines = [f"One optimiser step (forward, backward, global-norm clipping, AdamW), tokens/s, median of {repeats} "
           f"interleaved rounds of at least {min_sample_s:g} s per contender; ratios are per round (median and "
           "min–max over the rounds). First-step losses agree within "
           f"{max(r['loss']['relative_difference'] for r in rows):.1e} (relative).", "",
           markdown_table(["size", "B × T", *LABELS.values(), "baseline / HF eager", "baseline / HF compiled",
                           "all_taper / baseline", "MFU (baseline)"], table), ""]
  if peak:
    lines.append(f"MFU: 6·N + 12·L·D·T FLOPs per token against {peak['source']}.")
  return "\n".join(lines)


def mfu_cell(row: dict) -> str:
  """The baseline's model FLOPs utilisation, or n/a."""
  mfu = row["contenders"].get("baseline", {}).get("mfu")
  return "n/a" if mfu is None else f"{100 * mfu:.1f}%"
