"""This project's inference next to another implementation of the same model on the same weights (a peer).

The peer is Hugging Face transformers in experiments/benchmark_peer.py; this module holds what
needs no PyTorch: the settings, the weights (decode.py's calibrated-looking internal_taper
weights, as `baseline` and `folded` forms), this project's contenders, the interleaved grid and
the table. A peer offers, per cell, calls that take no arguments (or a one-line reason why one
cannot run), timed round-robin with this project's (`timing.time_interleaved`):

    forward   last-token logits of B×T tokens, no KV cache (the paper's measurement, docs/method.md §9);
              tokens/s = B·T ÷ seconds per call
    decode    greedy generation of N tokens after a P-token prompt, prefill included (an end-to-end
              `generate`); tokens/s = B·N ÷ seconds per call

Only the `baseline` form is a Hugging Face Llama (plain RMSNorms); `folded` is the g = 0 model of
the same weights (other numbers, as in decode.py), the one a folded checkpoint would serve.
"""

import dataclasses
import datetime
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from tapernorm_jax.runtime import hardware
from tapernorm_jax.benchmarks import decode as decode_bench
from tapernorm_jax.benchmarks.pytorch import training, training_table
from tapernorm_jax.benchmarks.decode import model_config
from tapernorm_jax.benchmarks.timing import check_at_least, paired_ratio, summary, time_interleaved
from tapernorm_jax.errors import UserError
from tapernorm_jax.inference import decode
from tapernorm_jax.inference import forms as forms_lib
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.model import ModelConfig, init, param_count

PyTree = Any
Calls = dict[str, Callable[[], Any] | str]  # a call, or the reason it cannot run ("n/a" in the table)
MODES = (*decode_bench.MODES, "train")  # train: benchmarks/pytorch/training.py
FORMS = ("baseline", "folded")  # this project's contenders; `baseline` is what the peer loads
PEERS = ("hf_eager", "hf_compiled")
LABELS = {
  "hf_eager": "HF eager",
  "hf_compiled": "HF torch.compile",
  "baseline": "ours baseline",
  "folded": "ours folded",
}
FULL_LABEL = "ours baseline, every position"  # decode_bench.FULL: the forward doing HF's work, a column of its own
PARITY_TOLERANCE = 1e-3  # max |logit difference| between the peer and the baseline form, both in float32


class ParityError(UserError, ValueError):
  """The peer's logits are not this project's on the same weights and tokens: any timing would compare two models."""


class Peer(Protocol):
  """The other implementation: its calls for one cell of each mode, and what it is."""

  def forward_calls(self, tokens_BxT: np.ndarray) -> Calls:
    """Last-token logits of `tokens_BxT` per peer contender (hf_eager, hf_compiled)."""

  def decode_calls(self, prompt_BxP: np.ndarray, new_tokens: int) -> Calls:
    """Greedy generation of `new_tokens` tokens per contender; each call returns the new tokens B×N (CPU)."""

  def describe(self) -> dict[str, Any]:
    """Versions, device, threads."""


@dataclasses.dataclass
class Settings(decode_bench.Settings):
  """benchmarks/decode.py's settings (defaults: the paper's grid at 30M), plus the peer's own and the train mode's."""

  compile: bool = True
  threads: int = 0  # PyTorch's intra-op threads; 0 = every core (os.cpu_count())
  train_cells: tuple[str, ...] = training.CELLS

  def __post_init__(self):
    super().__post_init__()
    check_at_least(self, 0, "threads")
    for cell in self.train_cells:
      training.parse_cell(cell)
    if self.dtype == "float64":
      raise ValueError("dtype='float64': choose float32, bfloat16 or float16 (or leave it empty)")

  @staticmethod
  def known_modes() -> tuple[str, ...]:
    """forward, decode and train."""
    return MODES


QUICK = dict(
  size="1m",
  batches=(1,),
  lengths=(128,),
  decode_batches=(1,),
  prompt=32,
  new_tokens=32,
  repeats=3,
  warmup=1,
  min_sample_s=0.05,
  train_cells=("1m:2x64",),
)  # a smoke run of a few minutes (mostly torch.compile)


def weights(s: Settings) -> dict[str, tuple[PyTree, ModelConfig]]:
  """The `baseline` and `folded` forms, in float32, of the weights benchmarks/decode.py times (same seeds)."""
  cfg = model_config(s.size, s.variant, "float32")
  make = jax.jit(lambda k0, k1: forms_lib.perturbed(init(cfg, k0), k1, (0.05, 0.5), 0.1))
  forms = forms_lib.forms(make(jax.random.key(s.seed), jax.random.key(s.seed + 1)), cfg)
  return {name: forms[name] for name in FORMS}


def in_dtype(variables: PyTree, cfg: ModelConfig, dtype: str) -> tuple[PyTree, ModelConfig]:
  """The form with its floating-point variables and its compute in `dtype`."""
  if jnp.dtype(dtype) == jnp.dtype(cfg.param_dtype) == jnp.dtype(cfg.compute_dtype):
    return variables, cfg
  cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
  return jax.tree.map(cast, variables), cfg.replace(dtype=dtype, param_dtype=dtype)


def last_logits(variables: PyTree, cfg: ModelConfig, tokens_BxT: np.ndarray) -> np.ndarray:
  """This project's last-token logits B×V, float32 matmuls at full precision (no TF32 on GPUs)."""
  with jax.default_matmul_precision("highest"):
    return np.asarray(forms_lib.last_token_logits(cfg)(variables, jnp.asarray(tokens_BxT)))


def parity(ours_BxV: np.ndarray, theirs_BxV: np.ndarray, tolerance: float = PARITY_TOLERANCE) -> dict[str, float]:
  """Max |difference| of two sets of last-token logits (and relative to the largest logit); ParityError above
  `tolerance`."""
  ours_BxV, theirs_BxV = np.asarray(ours_BxV, np.float64), np.asarray(theirs_BxV, np.float64)
  if ours_BxV.shape != theirs_BxV.shape:
    raise ParityError(f"the peer's last-token logits have shape {theirs_BxV.shape}, ours {ours_BxV.shape}")
  diff = float(np.abs(ours_BxV - theirs_BxV).max())
  out = {"max_abs_diff": diff, "max_abs_logit": float(np.abs(ours_BxV).max()), "tolerance": tolerance}
  if not diff <= tolerance:
    raise ParityError(
      f"the Hugging Face model's last-token logits differ from this project's baseline form by up "
      f"to {diff:.3g} (tolerance {tolerance:g}; largest logit {out['max_abs_logit']:.3g}): the "
      "exported checkpoint is not the same model (tapernorm_jax/hf/llama.py's name table or "
      "config), so no timing is reported"
    )
  return out


def decode_calls(runs: dict[str, tuple[PyTree, Any, ModelConfig]], prompt_BxP: np.ndarray, new_tokens: int) -> Calls:
  """This project's jitted greedy prefill-and-decode (`decode.generate`) per form, each with the variables and
  projection of `decode_bench.with_projections` for this batch (prepared outside the timed calls)."""
  prompt_BxP = jnp.asarray(prompt_BxP, jnp.int32)
  lengths_B = jnp.full((prompt_BxP.shape[0],), prompt_BxP.shape[1], jnp.int32)
  key = jax.random.key(0)
  return {
    name: (
      lambda v=v, cfg=cfg, projection=projection: decode.generate(
        v, cfg, prompt_BxP, lengths_B, key, max_new_tokens=new_tokens, projection=projection
      )
    )
    for name, (v, projection, cfg) in runs.items()
  }


def measure(calls: Calls, work: float, s: Settings) -> dict[str, dict]:
  """Per contender: throughput (work per second) of the runnable calls, timed round-robin; {"na": reason} for the
  rest."""
  runnable = {name: fn for name, fn in calls.items() if callable(fn)}
  samples = time_interleaved(runnable, s.repeats, s.warmup, s.min_sample_s) if runnable else {}
  return {name: summary(samples[name], work) if name in samples else {"na": fn} for name, fn in calls.items()}


def agreement(reference_BxN: Any, other_BxN: Any) -> int:
  """How many leading generated tokens agree in every row."""
  a_BxN, b_BxN = np.asarray(reference_BxN), np.asarray(other_BxN)
  if a_BxN.shape != b_BxN.shape:
    return 0
  same_N = np.all(a_BxN == b_BxN, axis=0)
  return int(same_N.size if same_N.all() else np.argmin(same_N))


def bench_forward(peer: Peer, forms: dict, s: Settings) -> list[dict]:
  """Tokens/s of the last-token-logits forward per (B, T) cell: the peer's contenders and this project's forms."""
  rows = []
  V = next(iter(forms.values()))[1].V
  for B in s.batches:
    for T in s.lengths:
      tokens_BxT = np.random.default_rng(1000 * B + T).integers(0, V, (B, T), dtype=np.int32)
      calls = {**peer.forward_calls(tokens_BxT), **decode_bench.forward_calls(forms, tokens_BxT)}
      row = {"B": B, "T": T, "contenders": measure(calls, B * T, s)}
      rows.append(row)
      log_row(f"forward B={B} T={T}", row)
  return rows


def bench_decode(peer: Peer, forms: dict, s: Settings) -> list[dict]:
  """Tokens/s of greedy generation (prefill included) per batch size; greedy agreement with this project's."""
  rows, copies = [], {}
  V = next(iter(forms.values()))[1].V
  P, N = s.prompt, s.new_tokens
  for B in s.decode_batches:
    prompt_BxP = np.random.default_rng(B).integers(0, V, (B, P), dtype=np.int32)
    runs = decode_bench.with_projections(forms, B, copies)
    calls = {**peer.decode_calls(prompt_BxP, N), **decode_calls(runs, prompt_BxP, N)}
    row = {"B": B, "prompt": P, "new_tokens": N, "contenders": measure(calls, B * N, s)}
    ours_BxN = np.asarray(calls["baseline"]())
    row["greedy_agreement"] = {
      name: agreement(ours_BxN, fn()) for name, fn in calls.items() if name in PEERS and callable(fn)
    }
    rows.append(row)
    log_row(f"decode B={B} P={P} N={N}", row)
  return rows


def log_row(title: str, row: dict) -> None:
  """Prints one cell's medians (or n/a) and folded's ratio to each peer contender."""
  c = row["contenders"]
  rate = lambda r: f"{r['median']:,.0f} tok/s (±{50 * r['spread']:.1f}%)" if "median" in r else "n/a"
  cells = ", ".join(f"{LABELS.get(name, FULL_LABEL)} {rate(r)}" for name, r in c.items())
  ratios = ", ".join(f"folded/{LABELS[name]} {ratio(c, name)}" for name in PEERS if "median" in c.get(name, {}))
  print(f"{title}: {cells}" + (f"; {ratios}" if ratios else ""), flush=True)


def run(
  s: Settings,
  description: dict[str, Any],
  peer: Peer | None = None,
  forms: dict[str, tuple[PyTree, ModelConfig]] | None = None,
  checked: dict[str, float] | None = None,
  spawn_train: training.Spawn | None = None,
) -> dict:
  """Times the selected modes: forward and decode on `forms` already checked against `peer` (`checked`: `parity`'s
  numbers), train with each contender in a worker process that `spawn_train` starts (`training.bench`)."""
  results: dict[str, Any] = {
    "date": datetime.date.today().isoformat(),
    "hardware": hardware.describe(),
    "peer": description,
    "settings": dataclasses.asdict(s),
    "load_average": os.getloadavg()[0],
  }
  cores = os.cpu_count() or 1
  if results["load_average"] > cores:
    print(
      f"warning: the machine is busy (load average {results['load_average']:.1f} on {cores} cores): "
      "multi-threaded timings, PyTorch's above all, are unreliable; rerun on an idle machine, or pass "
      "--threads=1",
      flush=True,
    )
  t0 = time.time()
  if forms:
    forms = {name: in_dtype(v, cfg, s.dtype) for name, (v, cfg) in forms.items()}
    results.update(
      model=forms["baseline"][1].to_dict(), params=param_count(forms["baseline"][0]["params"]), parity=checked
    )
    if "forward" in s.modes:
      results["forward"] = bench_forward(peer, forms, s)
    if "decode" in s.modes:
      results["decode"] = bench_decode(peer, forms, s)
  if "train" in s.modes:
    results["train"] = training.bench(s, spawn_train)
  results["wall_s"] = time.time() - t0
  return results


def cell(r: dict, unit: float = 1e3) -> str:
  """`12.34 ± 1.0%` (the median in `unit`s of tokens/s), or `n/a`."""
  return f"{r['median'] / unit:,.2f} ± {50 * r['spread']:.1f}%" if "median" in r else "n/a"


def ratio(c: dict, name: str, ours: str = "folded") -> str:
  """How many times faster `ours` ran than contender `name`, round by round: `1.23× (1.10–1.31)` (median, min–max
  over rounds; timing.paired_ratio), or `–`."""
  if "median" not in c.get(name, {}) or "median" not in c.get(ours, {}):
    return "–"
  r = paired_ratio(c[ours]["seconds"], c[name]["seconds"])
  return f"{r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})"


def reasons(rows: list[dict]) -> list[str]:
  """One line per contender that could not run, with its reason (each reason once)."""
  seen = {}
  for row in rows:
    for name, r in row["contenders"].items():
      if "na" in r:
        seen.setdefault((name, r["na"]), None)
  return [f"{LABELS[name]}: n/a ({reason})" for name, reason in seen]


def markdown(results: dict) -> str:
  """The forward (thousands of tokens/s) and decode (tokens/s) tables, ± half the min–max spread, with folded's ratio
  to each peer contender."""
  s, p, hw = results["settings"], results["peer"], results["hardware"]
  lines = [
    f"Measured {results['date']} on {hardware.one_line(hw)}, load average {results['load_average']:.1f} at "
    f"the start. Peer: torch {p['torch']} ({p['device']}, {p['threads']} thread{'s' * (p['threads'] != 1)}), "
    f"transformers {p['transformers']}, LlamaForCausalLM with SDPA attention. Ours: jax {hw['jax']}, jitted.",
    "",
  ]
  if "parity" in results:
    lines += [
      f"Inference: {s['size']} {s['variant']} model ({results['params']:,} parameters), {s['dtype']}, "
      f"median of {s['repeats']} interleaved runs (± half the min–max spread; ratios: median and min–max over "
      "those rounds of each round's ratio, which cancels load drifts slower than a round); the peer loads the "
      f"baseline form's weights (last-token logits within {results['parity']['max_abs_diff']:.1e} of ours "
      "in float32).",
      "",
    ]
  if results.get("forward"):
    full = decode_bench.FULL
    rows = [
      [
        r["B"],
        r["T"],
        *(cell(r["contenders"].get(n, {})) for n in (*LABELS, full)),
        ratio(r["contenders"], "hf_eager"),
        ratio(r["contenders"], "hf_compiled"),
        ratio(r["contenders"], "hf_eager", full),
      ]
      for r in results["forward"]
    ]
    lines += [
      "Last-token-logits forward, no KV cache, thousands of tokens/s. Ours runs its last block on the last "
      "position only (the one whose logits are asked for); HF's `logits_to_keep=1` runs every block on "
      "every position and only the head on the last. The column 'ours baseline, every position' does the "
      "work HF does:",
      "",
      markdown_table(
        [
          "B",
          "T",
          *LABELS.values(),
          FULL_LABEL,
          "folded / HF eager",
          "folded / HF compiled",
          "baseline every position / HF eager",
        ],
        rows,
      ),
      "",
    ]
    lines += [f"* {line}" for line in reasons(results["forward"])] + [""] * bool(reasons(results["forward"]))
  if results.get("decode"):
    rows = [
      [
        r["B"],
        r["prompt"],
        r["new_tokens"],
        *(cell(r["contenders"].get(n, {}), 1) for n in LABELS),
        ratio(r["contenders"], "hf_eager"),
        ratio(r["contenders"], "hf_compiled"),
        ", ".join(f"{a}/{r['new_tokens']}" for a in r["greedy_agreement"].values()) or "–",
      ]
      for r in results["decode"]
    ]
    lines += [
      "Greedy generation of N tokens after a P-token prompt, prefill included, new tokens/s "
      "(HF: `generate`, compiled with a static cache; ours: `decode.generate`). Last column: leading "
      "tokens equal to ours (baseline form), per HF contender:",
      "",
      markdown_table(
        ["B", "P", "N", *LABELS.values(), "folded / HF eager", "folded / HF compiled", "greedy = ours"], rows
      ),
      "",
    ]
    lines += [f"* {line}" for line in reasons(results["decode"])] + [""] * bool(reasons(results["decode"]))
  if results.get("train"):
    lines += [training_table.markdown(results["train"], s["repeats"], s["min_sample_s"]), ""]
  return "\n".join(lines)
