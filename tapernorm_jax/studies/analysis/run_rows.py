"""Run directories → one row per run: what each cell is (from results.json, config.json, cell.json or the sweep's
manifest), where it stands, and its results, throughput and MFU; how runs are ordered and labelled."""

import csv
import dataclasses
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from tapernorm_jax import config_fields
from tapernorm_jax.storage import run_files, integrity
from tapernorm_jax.runtime import costs
from tapernorm_jax.studies import manifest, spec
from tapernorm_jax.taper.variants import SIZES, VARIANTS

CSV_COLUMNS = (
  "cell",
  "variant",
  "aux",
  "scale_loss_weight",
  "size",
  "seed",
  "params",
  "steps",
  "tokens",
  "final_val_loss",
  "unigram_loss",
  "wall_time_s",
  "tokens_per_s",
  "mfu",
  "status",
  "error",
  "corpus",
  "device",
)
VARIANT_ORDER = (
  ("baseline", 0),
  ("baseline", 1),
  ("internal_taper", 1),
  ("all_taper", 1),
  ("final_taper", 1),
  ("fakeln", 1),
  ("prepbn", 0),
  ("prepbn", 1),
  ("dyt", 0),
  ("dyt", 1),
  ("derf", 0),
  ("derf", 1),
  ("internal_taper", 0),
  ("all_taper", 0),
  ("final_taper", 0),
  ("fakeln", 0),
)
Key = tuple[str, int]  # (variant, aux)
# A complete run whose validation loss is above the unigram reference less this (nats/token) learned no context
# worth the name (data/unigram.py); its loss enters no mean, gap, fit or prediction, and the report names it.
NO_CONTEXT_MARGIN = 0.1
FINISHED = ("complete", "no_context")  # states of a run that trained to its last step


def label(variant: str, aux: int) -> str:
  """`internal_taper (+aux)`, `all_taper (aux=0)`, `final_taper`: the aux setting where it matters."""
  if aux:
    return f"{variant} (+aux)"
  return f"{variant} (aux=0)" if VARIANTS.get(variant, ("", "", True))[2] else variant


def unanchored(variant: str, aux: int) -> bool:
  """The final norm is tapered and no scale loss replaces it (the paper's unanchored ablations)."""
  return VARIANTS.get(variant, ("", ""))[1] == "taper" and not aux


def scale_loss_weight(config: dict[str, Any]) -> float:
  """The λ of the scale loss a run's config (as read from disk, `config_fields.upgrade`d) gives its method."""
  return float(config.get(config.get("method", "taper"), {}).get("scale_loss_weight", 0.0))


def split_size(size: str) -> tuple[str, str]:
  """`cpu@tpp20` → ("cpu", "tpp20"): the size preset and the token budget ("" where the sweep gave none)."""
  preset, _, budget = size.partition("@")
  return preset, budget


def size_order(size: str) -> tuple[int, int, float]:
  """SIZES order (the cpu ladder, then 1m, 3m, 9m, 30m, 1b; unknown sizes last); a size's token budgets
  (`cpu@steps600`, `cpu@tpp20`) after it, steps then tokens per parameter, each ascending."""
  preset, budget = split_size(size)
  kind, number = spec.budget_number(budget) if budget else ("", 0.0)
  return list(SIZES).index(preset) if preset in SIZES else len(SIZES), ("", "steps", "tpp").index(kind), number


def budgets(sizes: Iterable[str]) -> list[str]:
  """The token budgets among size labels, ordered as size_order orders them ("", the sizes' own steps, first)."""
  return sorted({split_size(size)[1] for size in sizes}, key=lambda budget: size_order(f"@{budget}"))


def variant_order(key: Key) -> tuple[int, str, int]:
  """The baseline and its matched control first, anchored variants, then unanchored ones; others after, by name."""
  return (VARIANT_ORDER.index(key) if key in VARIANT_ORDER else len(VARIANT_ORDER), *key)


def params_text(params: int | None) -> str:
  """`226.8K`, `30.29M`."""
  if params is None:
    return "?"
  return f"{params / 1e6:.2f}M" if params >= 1e6 else f"{params / 1e3:.1f}K"


# ------------------------------------------------------------------------------------------------ run rows


@dataclasses.dataclass
class Run:
  """One cell of a study: what it is, where it stands and, when complete, its results."""

  cell: str
  variant: str
  aux: int  # the scale loss on (1) or off (0)
  size: str  # the size preset, `@` its token budget where the sweep gave one (`cpu@tpp20`; studies/launch/grid.py)
  seed: int
  # complete | no_context (complete, its loss within NO_CONTEXT_MARGIN of the unigram reference or above it) | failed
  # | incomplete | pending (never started) | missing (in the grid, no directory)
  status: str
  path: str = ""
  error: str = ""
  params: int | None = None
  steps: int | None = None
  tokens: int | None = None
  final_val_loss: float | None = None
  unigram_loss: float | None = None  # results.json's unigram_val_loss (runs before it was recorded: None)
  wall_time_s: float | None = None
  tokens_per_s: float | None = None
  mfu: float | None = None
  corpus: str = ""
  scale_loss_weight: float | None = None  # its λ as the run's method used it
  device: str = ""
  config: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def key(self) -> Key:
    """(variant, aux)."""
    return self.variant, self.aux

  def csv_row(self) -> dict[str, Any]:
    """The results.csv columns."""
    return {c: ("" if getattr(self, c) is None else getattr(self, c)) for c in CSV_COLUMNS}


def read_metrics(run_dir: str, max_points: int = 2000) -> list[dict[str, Any]]:
  """`metrics.jsonl`, thinned to about `max_points` step records (every diagnostics record and the last kept); a
  torn or damaged line raises integrity.DamagedLinesError naming the file, the line and the fix."""
  return [json.loads(body) for _, body in metrics_lines(run_dir, max_points)]


def metrics_lines(run_dir: str, max_points: int = 2000) -> list[tuple[str, str]]:
  """The lines `read_metrics` keeps, each as written and as its record's JSON.

  Streams the file, checking every line's checksum but keeping only the lines it thins to, so million-step runs read
  in seconds.
  """
  path = os.path.join(run_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    head = f.read(65536)
    lines_estimate = os.path.getsize(path) / max(len(head) / max(head.count("\n"), 1), 1)
    every = max(1, int(lines_estimate // max_points))
    checked = integrity.carries_checksums(head)
    f.seek(0)
    kept, last, kept_last = [], ("", ""), True
    for i, line in enumerate(f):
      if not line.strip():
        continue
      body = integrity.line_body(line) if checked else line
      if body is None:
        _, damage = integrity.read_lines(epath.Path(path))
        raise integrity.DamagedLinesError(
          f"{path}: {damage}; the history of this run cannot be trusted, so it is not reported. Run its training "
          "command again on this directory (it cuts the history back to its last verified record, and says which "
          "steps that loses), or move the run aside and train the cell again"
        )
      last, kept_last = (line, body), i % every == 0 or '"logit_norm"' in line
      if kept_last:
        kept.append(last)
  if not kept_last:
    kept.append(last)
  return kept


def flops_per_token(config: Mapping[str, Any], params: int) -> float | None:
  """Training FLOPs per token, 6·N + 12·L·D·T (PaLM's estimate with attention), from a run's config.json."""
  model = config.get("model", {})
  if not all(k in model for k in ("L", "D", "T")):
    return None
  return costs.train_flops_per_token(params, model["L"], model["D"], model["T"])


def steady_tokens_per_s(records: Sequence[Mapping[str, Any]]) -> float | None:
  """The median of the logged training throughput (robust to the first, compiling interval)."""
  values = [r["tokens_per_s"] for r in records if isinstance(r.get("tokens_per_s"), (int, float))]
  return float(np.median(values)) if values else None


def read_run(run_dir: str, expected: Mapping[str, Any] | None = None) -> Run:
  """One run directory as a Run: identity from results.json, config.json, cell.json or the manifest entry."""
  name = os.path.basename(os.path.normpath(run_dir))
  status = manifest.cell_status(run_dir)
  results = dict(status.results or {})
  config = config_fields.upgrade(run_files.read_json(os.path.join(run_dir, "config.json")) or {})
  record = manifest.read_record(run_dir)
  ident = {**(expected or {}), **record}
  if config:
    ident.update(
      variant=config.get("variant", ident.get("variant")),
      size=config.get("size", ident.get("size")),
      seed=config.get("seed", ident.get("seed")),
    )
  if results:
    ident.update(
      variant=config_fields.current_value("variant", results["variant"]), size=results["size"], seed=results["seed"]
    )
  # The λ the run's method used: results.json's, else its config's (results.json before the rename recorded
  # taper.aux_weight whatever the method, so it is the last resort).
  weight = results.get("scale_loss_weight", scale_loss_weight(config) if config else results.get("aux_weight"))
  if weight is not None:
    ident["aux"] = int(weight > 0)
  if not all(k in ident for k in ("variant", "size", "seed", "aux")):
    raise ValueError(
      f"{run_dir}: neither results.json, config.json nor cell.json says which run this is; "
      "move it out of the study directory"
    )
  run = Run(
    cell=name,
    variant=ident["variant"],
    aux=int(ident["aux"]),
    seed=int(ident["seed"]),
    size=spec.point(ident["size"], ident.get("budget", "")),
    status=status.state,
    path=run_dir,
    error=status.error,
    config=config,
    scale_loss_weight=weight,
  )
  if status.state == "incomplete":
    where = f"at step {status.step} of {config.get('train', {}).get('steps', '?')}"
    run.error = f"running, or interrupted {where}" if record.get("status") == "running" else f"stopped {where}"
  if results:
    run.params, run.steps, run.tokens = results.get("params"), results.get("steps"), results.get("tokens")
    loss = results.get("final_val_loss")
    run.final_val_loss = float(loss) if loss is not None else None
    run.unigram_loss = results.get("unigram_val_loss")
    if run.final_val_loss is not None and not math.isfinite(run.final_val_loss):
      run.status, run.error = "failed", f"final validation loss is {run.final_val_loss}"
    elif learned_no_context(run):
      run.status = "no_context"
      run.error = (
        f"validation loss {run.final_val_loss:.4g} against the unigram reference {run.unigram_loss:.4f}: "
        "it learned no context"
      )
    run.wall_time_s, run.corpus = results.get("wall_time_s"), results.get("corpus", "")
    run.tokens_per_s = steady_tokens_per_s(read_metrics(run_dir)) or (
      run.tokens / run.wall_time_s if run.tokens and run.wall_time_s else None
    )
    kind = results.get("device_kind") or record.get("device_kind", "")
    count = int(results.get("devices") or record.get("device_count") or 1)
    run.device = f"{kind} × {count}" if kind else f"{results.get('backend', '?')} × {count}"
    if (cpu := results.get("cpu_identity") or {}).get("vendor"):  # runs before it was recorded: the device alone
      run.device += f" on {cpu['model_name']} ({cpu['vendor']} family {cpu['family']} model {cpu['model']})"
    fpt = flops_per_token(config, run.params) if run.params else None
    # the run's own peak (hardware.peak: CPUs included), else the data sheet's for its device kind
    peak = results.get("peak_flops") or count * (costs.peak_flops(kind) or 0)
    run.mfu = costs.mfu(run.tokens_per_s, fpt, peak) if fpt else None
  return run


def csv_text(runs: Sequence[Run]) -> str:
  """results.csv: one row per run, CSV_COLUMNS."""
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
  writer.writeheader()
  for run in runs:
    writer.writerow(run.csv_row())
  return out.getvalue()


def learned_no_context(run: Run) -> bool:
  """A complete run whose validation loss is above its unigram reference less NO_CONTEXT_MARGIN (or diverged above
  it); False where the run recorded no reference."""
  return (
    run.status == "complete"
    and run.final_val_loss is not None
    and run.unigram_loss is not None
    and run.final_val_loss > run.unigram_loss - NO_CONTEXT_MARGIN
  )


def is_run_dir(path: str) -> bool:
  """A directory that holds (or held) a run: results.json, config.json, metrics.jsonl or a sweep cell record."""
  return os.path.isdir(path) and any(
    os.path.exists(os.path.join(path, f))
    for f in ("results.json", "config.json", "metrics.jsonl", manifest.CELL_RECORD)
  )


def read_runs(workdir: str) -> list[Run]:
  """Every run under `workdir`, plus a `missing` row for each cell of the sweep manifest without a directory."""
  listed = manifest.read_manifest(workdir) or {"cells": []}
  expected = {c["name"]: c for c in listed["cells"]}
  runs = [
    read_run(os.path.join(workdir, name), expected.get(name))
    for name in sorted(os.listdir(workdir))
    if is_run_dir(os.path.join(workdir, name))
  ]
  present = {r.cell for r in runs}
  runs += [
    Run(
      cell=name,
      variant=c["variant"],
      aux=int(c["aux"]),
      size=spec.point(c["size"], c.get("budget", "")),
      seed=int(c["seed"]),
      status="missing",
    )
    for name, c in expected.items()
    if name not in present
  ]
  return sorted(runs, key=lambda r: (size_order(r.size), r.size, variant_order(r.key), r.variant, r.aux, r.seed))
