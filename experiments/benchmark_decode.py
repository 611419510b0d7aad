"""Inference throughput of baseline, unfused, folded and identity models on the same weights (PAPER.md §7).

    python -m experiments.benchmark_decode             # the paper's grid: 30M, B ∈ {1, 4} × T ∈ {128, 256, 512}
    python -m experiments.benchmark_decode --quick     # a 1M-model smoke run in under a minute
    python -m experiments.benchmark_decode --size=9m --batches=1 --lengths=128,256 --repeats=7

Forms (one set of internal_taper weights, the paper's model): `baseline` runs the norms as
RMSNorm, `unfused` keeps the g = 0 map as an explicit `c·γ̃` multiply, `folded` has it folded
into QKV and the MLP input, and `identity` drops every norm (the upper bound). Modes:
`forward` is the paper's last-token-logits forward over B×T tokens (no cache); `decode` is
KV-cache generation of N tokens after a P-token prompt, timed apart from the prefill and set
against the memory-bandwidth roofline: bytes of weights and cache read per step ÷ the read
bandwidth of a jitted sum over an array of that same size (so it streams from wherever the
weights stream from: DRAM, or a cache level they fit in), sampled between the decode runs.
A sum over 1 GiB gives the DRAM bandwidth as well. Timings exclude compilation and warm-up,
block until ready, and interleave the forms round-robin so drifting machine load hits all of
them alike. Writes `results.json` and `table.md` under --out.
"""

import dataclasses
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from absl import app, flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from configs import base
from tapernorm_jax import decode
from tapernorm_jax.fold import fold
from tapernorm_jax.model import ModelConfig, Transformer, abstract_variables, init, param_count

PyTree = Any
FORMS = ("baseline", "unfused", "folded", "identity")
# PAPER.md §7: thousands of tokens/s on an H100 in bf16 (PyTorch), as (baseline, unfused, folded).
PAPER = {(1, 128): (40.7, 45.9, 48.7), (1, 256): (79.3, 90.8, 96.8), (1, 512): (163.2, 181.7, 195.5),
         (4, 128): (149.3, 169.3, 180.4), (4, 256): (290.5, 323.6, 344.9), (4, 512): (546.3, 588.1, 615.9)}

_FLAGS: dict[str, Any] = {}  # filled by define_flags() when run as a script; importing defines no flags


def define_flags() -> dict[str, Any]:
  """The command-line flags (defined only when run as a script, so other entry points can import this module)."""
  return dict(
      size=flags.DEFINE_enum("size", "30m", list(base.SIZES), "Model size (the paper's 1m/3m/9m/30m, or cpu)."),
      variant=flags.DEFINE_enum("variant", "internal_taper", ["internal_taper", "all_taper"], "Which norms taper."),
      modes=flags.DEFINE_list("modes", ["forward", "decode"], "forward and/or decode."),
      batches=flags.DEFINE_list("batches", ["1", "4"], "Batch sizes of the forward mode."),
      lengths=flags.DEFINE_list("lengths", ["128", "256", "512"], "Sequence lengths T of the forward mode."),
      decode_batches=flags.DEFINE_list("decode_batches", ["1", "4"], "Batch sizes of the decode mode."),
      prompt=flags.DEFINE_integer("prompt", 128, "Prompt length P of the decode mode."),
      new_tokens=flags.DEFINE_integer("new_tokens", 128, "Tokens N generated per row in the decode mode."),
      repeats=flags.DEFINE_integer("repeats", 7, "Timed samples per form and cell (median and spread reported)."),
      warmup=flags.DEFINE_integer("warmup", 2, "Untimed calls per form and cell after compiling."),
      min_sample_s=flags.DEFINE_float("min_sample_s", 1.0, "Each timed sample loops calls for at least this long."),
      dtype=flags.DEFINE_string("dtype", None, "Compute and weight dtype (default: float32 on CPU, else bfloat16)."),
      quick=flags.DEFINE_bool("quick", False, "Smoke preset: 1m model, B=1, T=128, 3 repeats, 32 new tokens."),
      out=flags.DEFINE_string("out", "runs/benchmark_decode", "Output directory for results.json and table.md."),
      seed=flags.DEFINE_integer("seed", 0, "Weight seed."),
  )


@dataclasses.dataclass
class Settings:
  """Everything that defines one benchmark run."""

  size: str
  variant: str
  modes: list[str]
  batches: list[int]
  lengths: list[int]
  decode_batches: list[int]
  prompt: int
  new_tokens: int
  repeats: int
  warmup: int
  min_sample_s: float
  dtype: str
  seed: int


def settings_from_flags() -> Settings:
  """Flags (and the --quick preset) as Settings."""
  f = {name: holder.value for name, holder in _FLAGS.items()}
  s = Settings(size=f["size"], variant=f["variant"], modes=list(f["modes"]),
               batches=[int(b) for b in f["batches"]], lengths=[int(t) for t in f["lengths"]],
               decode_batches=[int(b) for b in f["decode_batches"]], prompt=f["prompt"],
               new_tokens=f["new_tokens"], repeats=f["repeats"], warmup=f["warmup"],
               min_sample_s=f["min_sample_s"], dtype=f["dtype"] or default_dtype(), seed=f["seed"])
  if f["quick"]:
    s = dataclasses.replace(s, size="1m", batches=[1], lengths=[128], decode_batches=[1], prompt=32, new_tokens=32,
                            repeats=3, warmup=1, min_sample_s=0.05)
  unknown = set(s.modes) - {"forward", "decode"}
  if unknown:
    raise app.UsageError(f"unknown --modes {sorted(unknown)}; choose from forward, decode")
  return s


def default_dtype() -> str:
  """float32 on CPU, bfloat16 on accelerators."""
  return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def model_config(size: str, variant: str, dtype: str) -> ModelConfig:
  """The paper's model of `size` with `variant`'s norms, weights and activations in `dtype`."""
  cfg = ModelConfig.from_config(base.get_config(variant, f"size={size}").model)
  return cfg.replace(dtype=dtype, param_dtype=dtype)


def make_forms(cfg: ModelConfig, seed: int) -> dict[str, tuple[PyTree, ModelConfig]]:
  """The four forms of one set of tapered weights (calibrated-looking c and γ̃), each with only its variables."""
  variables = nn.unbox(init(cfg, jax.random.key(seed)))
  keys = iter(jax.random.split(jax.random.key(seed + 1), 4 * len(jax.tree.leaves(variables))))

  def calibrated(path, x):
    name = jax.tree_util.keystr(path)
    if "'c'" in name:
      return jax.random.uniform(next(keys), x.shape, x.dtype, 0.05, 0.5)
    if "scale" in name:
      return (1 + 0.1 * jax.random.normal(next(keys), x.shape)).astype(x.dtype)
    return x

  variables = jax.tree_util.tree_map_with_path(calibrated, variables)
  swap = lambda norm: dict(internal_norm=norm, final_norm=norm if cfg.final_norm != "plain" else "plain")
  forms = {
      "baseline": cfg.replace(**swap("plain")),
      "unfused": cfg.replace(**swap("scale")),
      "identity": cfg.replace(internal_norm="identity", final_norm="identity"),
  }
  out = {name: (select(variables, form_cfg), form_cfg) for name, form_cfg in forms.items()}
  out["folded"] = fold(variables, cfg)
  return {name: out[name] for name in FORMS}


def select(variables: PyTree, cfg: ModelConfig) -> PyTree:
  """The subset of `variables` that the model `cfg` reads (so each form gets exactly its own weights)."""
  shapes = nn.unbox(abstract_variables(cfg))
  return _subset(variables, shapes)


def _subset(tree: PyTree, like: PyTree) -> PyTree:
  """`tree` restricted to the keys of `like` (nested dicts)."""
  return {k: _subset(tree[k], v) if isinstance(v, dict) else tree[k] for k, v in like.items()}


def bandwidth_probe(nbytes: int) -> Callable[[], jax.Array]:
  """A call that reads `nbytes` once: a jitted sum over an fp32 array of that size."""
  x = jnp.ones((max(nbytes // 4, 1),), jnp.float32)
  total = jax.jit(jnp.sum)
  return lambda: total(x)


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 7) -> dict[str, float]:
  """Read bandwidth (GB/s, median and best) of a jitted sum over `nbytes` bytes."""
  probe = bandwidth_probe(nbytes)
  seconds = time_interleaved({"sum": probe}, repeats, warmup=1, min_sample_s=0.0)["sum"]
  return {"bytes": nbytes, "median_gb_s": nbytes / statistics.median(seconds) / 1e9,
          "best_gb_s": nbytes / min(seconds) / 1e9}


def time_interleaved(calls: dict[str, Callable[[], Any]], repeats: int, warmup: int,
                     min_sample_s: float) -> dict[str, list[float]]:
  """Seconds per call of each function: warm-up, then `repeats` samples taken round-robin over the functions."""
  loops = {}
  for name, fn in calls.items():
    jax.block_until_ready(fn())  # compiles
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
      jax.block_until_ready(fn())
    per_call = (time.perf_counter() - t0) / max(warmup, 1)
    loops[name] = max(1, int(np.ceil(min_sample_s / max(per_call, 1e-9))))
  samples: dict[str, list[float]] = {name: [] for name in calls}
  for _ in range(repeats):
    for name, fn in calls.items():
      t0 = time.perf_counter()
      for _ in range(loops[name]):
        out = fn()
      jax.block_until_ready(out)
      samples[name].append((time.perf_counter() - t0) / loops[name])
  return samples


def summary(seconds: list[float], work: float) -> dict[str, float]:
  """Throughput (work per second) from per-call times: median, min, max and the relative spread."""
  rates = sorted(work / s for s in seconds)
  median = statistics.median(rates)
  return {"median": median, "min": rates[0], "max": rates[-1], "spread": (rates[-1] - rates[0]) / median,
          "seconds": seconds}


def last_token_logits(cfg: ModelConfig) -> Callable[[PyTree, jax.Array], jax.Array]:
  """The paper's forward: the whole sequence through the blocks, the head on the last position only."""
  model = Transformer(cfg)

  def forward(variables: PyTree, tokens_BxT: jax.Array) -> jax.Array:
    h_BxTxD = model.apply(variables, tokens_BxT, 0.0, method=Transformer.hidden)
    return model.apply(variables, h_BxTxD[:, -1:], 0.0, method=Transformer.logits)[:, 0]

  return jax.jit(forward)


def bench_forward(forms: dict, s: Settings) -> list[dict]:
  """Tokens/s of the last-token-logits forward for every (B, T) cell and form."""
  rows = []
  for B in s.batches:
    for T in s.lengths:
      tokens_BxT = jax.random.randint(jax.random.key(T + B), (B, T), 0, next(iter(forms.values()))[1].V)
      calls = {name: (lambda f=last_token_logits(cfg), v=v: f(v, tokens_BxT)) for name, (v, cfg) in forms.items()}
      samples = time_interleaved(calls, s.repeats, s.warmup, s.min_sample_s)
      row = {"B": B, "T": T, "forms": {name: summary(sec, B * T) for name, sec in samples.items()}}
      rows.append(row)
      log_row(f"forward B={B} T={T}", row, "tok/s")
  return rows


def bytes_per_decode_step(variables: PyTree, cfg: ModelConfig, B: int, cache: decode.Cache) -> dict[str, int]:
  """Bytes one decode step must read: every weight once (embedding tables: only B rows unless tied) and the cache."""
  params = variables["params"]
  total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  for table in ("embed", "pos_embed"):
    if table in params and not (table == "embed" and cfg.tie_embeddings):
      x = params[table]
      total -= x.size * x.dtype.itemsize - B * x.shape[1] * x.dtype.itemsize
  return {"weights": int(total), "cache": decode.cache_bytes(cache)}


def bench_decode(forms: dict, s: Settings) -> list[dict]:
  """KV-cache generation: prefill and per-token decode timed apart; decode set against the roofline."""
  rows = []
  for B in s.decode_batches:
    P, N = s.prompt, s.new_tokens
    prompt_BxP = jax.random.randint(jax.random.key(B), (B, P), 0, next(iter(forms.values()))[1].V)
    lengths_B = jnp.full((B,), P, jnp.int32)
    prefills, loops, traffic = {}, {}, {}
    for name, (v, cfg) in forms.items():
      decode.check_lengths(cfg, P, N)
      prefill = jax.jit(lambda v, p, n, c, cfg=cfg: decode.prefill(v, cfg, p, n, c))
      empty = decode.init_cache(cfg, B, decode.cache_length(P, N))
      logits_BxV, cache = prefill(v, prompt_BxP, lengths_B, empty)
      first_B = jnp.argmax(logits_BxV, -1).astype(jnp.int32)
      loop = jax.jit(lambda v, f, n, c, cfg=cfg: decode.decode_loop(v, cfg, f, n, c, jax.random.key(0), N))
      prefills[name] = lambda prefill=prefill, v=v, empty=empty: prefill(v, prompt_BxP, lengths_B, empty)
      loops[name] = lambda loop=loop, v=v, first_B=first_B, cache=cache: loop(v, first_B, lengths_B, cache)
      traffic[name] = bytes_per_decode_step(v, cfg, B, cache)
    step_bytes = traffic["folded"]["weights"] + traffic["folded"]["cache"]
    loops["read"] = bandwidth_probe(step_bytes)  # the roofline's bandwidth, sampled between the decode runs
    prefill_samples = time_interleaved(prefills, s.repeats, s.warmup, s.min_sample_s)
    loop_samples = time_interleaved(loops, s.repeats, s.warmup, s.min_sample_s)
    bandwidth = summary(loop_samples.pop("read"), step_bytes / 1e9)
    row = {"B": B, "prompt": P, "new_tokens": N, "read_gb_s": bandwidth, "forms": {}}
    for name in forms:
      steps = N - 1  # the first new token comes from the prefill
      stats = summary(loop_samples[name], B * steps)
      form_bytes = traffic[name]["weights"] + traffic[name]["cache"]
      roofline_tokens_s = B * bandwidth["median"] * 1e9 / form_bytes
      stats.update(bytes_per_step=traffic[name], roofline_tokens_s=roofline_tokens_s,
                   roofline_fraction=stats["median"] / roofline_tokens_s,
                   prefill=summary(prefill_samples[name], B * P))
      row["forms"][name] = stats
    rows.append(row)
    log_row(f"decode B={B} P={P} N={N} (read bandwidth {bandwidth['median']:.1f} GB/s over "
            f"{step_bytes / 1e6:.0f} MB)", row, "tok/s")
  return rows


def log_row(title: str, row: dict, unit: str) -> None:
  """Prints one cell's medians and ratios to baseline."""
  base_rate = row["forms"]["baseline"]["median"]
  cells = ", ".join(f"{name} {r['median']:,.0f} {unit} ({r['median'] / base_rate:.3f}×, ±{50 * r['spread']:.1f}%)"
                    for name, r in row["forms"].items())
  print(f"{title}: {cells}", flush=True)


def hardware() -> dict[str, Any]:
  """What the numbers were measured on (CPU model and last-level cache from Linux's /proc and /sys)."""
  device = jax.devices()[0]
  return {"backend": jax.default_backend(), "device": getattr(device, "device_kind", str(device)),
          "device_count": jax.device_count(), "cpu": _read_first("/proc/cpuinfo", "model name") or platform.machine(),
          "cpu_count": os.cpu_count(), "l3_cache": _read_first("/sys/devices/system/cpu/cpu0/cache/index3/size"),
          "jax": jax.__version__, "python": platform.python_version()}


def _read_first(path: str, key: str | None = None) -> str | None:
  """The first line of a small system file (or the value of its first `key: value` line); None if absent."""
  try:
    with open(path) as f:
      for line in f:
        if key is None:
          return line.strip()
        if line.startswith(key):
          return line.split(":", 1)[1].strip()
  except OSError:
    return None
  return None


def markdown(results: dict) -> str:
  """Tables laid out like PAPER.md §7 (k tokens/s, ratio to baseline), plus the decode roofline table."""
  hw, s = results["hardware"], results["settings"]
  where = (f"{hw['cpu']}, {hw['cpu_count']} cores, L3 {hw.get('l3_cache') or '?'}" if hw["backend"] == "cpu"
           else f"{hw['device']} ({hw['backend']})")
  lines = [f"Measured {results['date']} on {where}, "
           f"{s['size']} {s['variant']} model ({results['params']:,} parameters), {s['dtype']}, "
           f"median of {s['repeats']} interleaved runs (± half the min–max spread). "
           f"DRAM read bandwidth (jitted sum over {results['bandwidth']['bytes'] / 2**30:.0f} GiB): "
           f"{results['bandwidth']['median_gb_s']:.1f} GB/s.", ""]
  if results.get("forward"):
    lines += ["Last-token-logits forward, no KV cache, thousands of tokens/s (ratio to baseline):", "",
              "| B | T | baseline | unfused | folded | identity | folded / identity | paper folded (H100) |",
              "|---|---|---|---|---|---|---|---|"]
    for row in results["forward"]:
      f = row["forms"]
      base_rate = f["baseline"]["median"]
      cell = lambda n: f"{f[n]['median'] / 1e3:.2f} ± {50 * f[n]['spread']:.1f}% ({f[n]['median'] / base_rate:.3f}×)"
      paper = PAPER.get((row["B"], row["T"]))
      paper_cell = f"{paper[2]:.1f} ({paper[2] / paper[0]:.2f}×)" if paper else "–"
      lines.append(f"| {row['B']} | {row['T']} | {f['baseline']['median'] / 1e3:.2f} ± "
                   f"{50 * f['baseline']['spread']:.1f}% | {cell('unfused')} | {cell('folded')} | {cell('identity')} | "
                   f"{f['folded']['median'] / f['identity']['median']:.3f} | {paper_cell} |")
    lines.append("")
  if results.get("decode"):
    lines += ["KV-cache decode after a P-token prompt (prefill excluded), tokens/s (ratio to baseline). Roofline = "
              "B × read bandwidth ÷ bytes read per step (weights + KV cache), with the bandwidth of a sum over as "
              "many bytes as one step reads (sampled between the decode runs), and with the DRAM bandwidth:", "",
              "| B | P | N | baseline | unfused | folded | identity | MB read / step | read GB/s | roofline tok/s | "
              "folded % of roofline | folded % of DRAM roofline |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    dram_roofline = lambda B, step: B * results["bandwidth"]["median_gb_s"] * 1e9 / (step["weights"] + step["cache"])
    for row in results["decode"]:
      f = row["forms"]
      base_rate = f["baseline"]["median"]
      cell = lambda n: f"{f[n]['median']:,.1f} ({f[n]['median'] / base_rate:.3f}×)"
      step = f["folded"]["bytes_per_step"]
      lines.append(f"| {row['B']} | {row['prompt']} | {row['new_tokens']} | {f['baseline']['median']:,.1f} | "
                   f"{cell('unfused')} | {cell('folded')} | {cell('identity')} | "
                   f"{(step['weights'] + step['cache']) / 1e6:.1f} | {row['read_gb_s']['median']:.1f} | "
                   f"{f['folded']['roofline_tokens_s']:,.1f} | {100 * f['folded']['roofline_fraction']:.0f}% | "
                   f"{100 * f['folded']['median'] / dram_roofline(row['B'], step):.0f}% |")
    lines.append("")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  s = settings_from_flags()
  cfg = model_config(s.size, s.variant, s.dtype)
  forms = make_forms(cfg, s.seed)
  results: dict[str, Any] = {"date": datetime.date.today().isoformat(), "hardware": hardware(),
                             "settings": dataclasses.asdict(s), "model": dataclasses.asdict(cfg),
                             "params": param_count(forms["baseline"][0]["params"])}
  print(f"{s.size} {s.variant}: {results['params']:,} parameters, {s.dtype}, on {results['hardware']['device']}",
        flush=True)
  results["bandwidth"] = read_bandwidth()
  print(f"DRAM read bandwidth (sum over 1 GiB): {results['bandwidth']['median_gb_s']:.1f} GB/s "
        f"(best {results['bandwidth']['best_gb_s']:.1f})", flush=True)
  t0 = time.time()
  if "forward" in s.modes:
    results["forward"] = bench_forward(forms, s)
  if "decode" in s.modes:
    results["decode"] = bench_decode(forms, s)
  results["wall_s"] = time.time() - t0
  out = _FLAGS["out"].value
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
  table = markdown(results)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table + "\n")
  print("\n" + table)
  print(f"wrote {os.path.join(out, 'results.json')} and table.md ({results['wall_s']:.0f} s)")


if __name__ == "__main__":
  _FLAGS.update(define_flags())
  app.run(main)
