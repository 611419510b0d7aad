"""What the study tests share: a tiny sweep, writing it as a sweep file, running an entry point."""

import subprocess
import sys

from locations import ROOT

TINY = {
  "model": {"D": 32, "H": 4, "L": 1, "T": 32, "V": 512},
  "train": {"steps": 6, "batch_size": 4, "log_every": 3, "diag_every": 3, "eval_batches": 1},
  "checkpoint": {"every": 3},
  "taper": {"gate_warmup_frac": 0.34},
  "data": {"synthetic_train_stories": 200, "synthetic_valid_stories": 30},
}


def tiny_sweep(data_dir: str, grids: list[dict]) -> dict:
  """A sweep of the tiny config over `grids`, its data prepared in `data_dir`."""
  return {
    "name": "tiny",
    "seeds": (0,),
    "grids": grids,
    "overrides": {**TINY, "data": {**TINY["data"], "data_dir": data_dir}},
  }


def quiet(_: str) -> None:
  """Swallows progress lines."""


def write_sweep_file(path, sweep_cfg: dict) -> str:
  """A sweep file whose get_config() returns `sweep_cfg` as a ConfigDict, as the shipped sweep files do."""
  path.write_text(f"import ml_collections\n\ndef get_config():\n  return ml_collections.ConfigDict({sweep_cfg!r})\n")
  return str(path)


def run_cli(module: str, *flags: str, check: bool = True) -> subprocess.CompletedProcess:
  """`python -m <module> <flags>` from the repository root (8 fake CPU devices, as set by conftest)."""
  proc = subprocess.run(
    [sys.executable, "-m", module, *flags], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
  )
  if check and proc.returncode:
    raise AssertionError(f"{module} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
  return proc
