"""What every entry point shares: `run(main)` in place of absl's `app.run(main)`, and flags from a settings dataclass
(`flags.py`). `run` reports a user's mistake as one line on stderr and exits 2, or 1 for a stopped run, without a
traceback (what counts as which: `failures.py`); anything else is a bug and keeps its traceback, and `--verbose`
shows it for mistakes too. `--check_only` checks the flags, config files and a training config's values, then exits.
Before anything runs, glibc's malloc is told to keep freed memory (`runtime/allocator.py`: XLA:CPU's per-step
buffers without page faults).
"""

import functools
import json
import logging as std_logging
from collections.abc import Callable
from typing import Any

from absl import app, logging
from absl.flags import FLAGS

from tapernorm_jax.runtime import allocator
from tapernorm_jax.cli.failures import describe, exit_code, fail
from tapernorm_jax.cli.flags import (
  check_only,
  config_flag_names,
  define_config_file,
  define_flags,
  from_flags,
  parse_flags,
  settings,
  verbose,
)

__all__ = ["define_config_file", "define_flags", "exit_code", "fail", "from_flags", "guard", "run", "settings", "train"]


def run(main: Callable[[list[str]], Any]) -> None:
  """absl's app.run(main), with flag and config mistakes and the user errors `main` raises reported in one line;
  malloc keeps freed memory for reuse (`runtime/allocator.py`; fully where jax has not started threads yet)."""
  allocator.keep_freed_memory()
  app.run(guard(main), flags_parser=parse_flags)


def guard(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
  """`main` with its user errors turned into `error: ...` on stderr and exit code 2 (1 for a non-finite loss)."""

  @functools.wraps(main)
  def guarded(argv: list[str]) -> Any:
    if not verbose(argv):
      logging.get_absl_handler().setFormatter(Plain())
    try:
      if check_only():
        check_run_configs()
        print("--check_only: the flags, config files and config values are valid; nothing was run")
        return None
      return main(argv)
    except Exception as e:  # noqa: BLE001 (classified below; bugs are re-raised)
      code = exit_code(e)
      if code is None or verbose(argv):
        raise
      fail(describe(e), code)

  return guarded


class Plain(std_logging.Formatter):
  """A record as the terminal shows it: `warning: message`, an info record's message alone; errors and records with
  a traceback as absl writes them (time, thread, source line). `--verbose` keeps absl's prefix on every record."""

  def __init__(self) -> None:
    super().__init__()
    self.absl = logging.PythonFormatter()

  def format(self, record: std_logging.LogRecord) -> str:
    if record.levelno in (std_logging.INFO, std_logging.WARNING) and not record.exc_info:
      return ("warning: " if record.levelno == std_logging.WARNING else "") + record.getMessage()
    return self.absl.format(record)


def check_run_configs() -> None:
  """--check_only: every training config among the flags checked as a run checks it before compiling (the batch's
  split over devices against mesh.data × mesh.fsdp where both are set, else not)."""
  from tapernorm_jax.train import run_config  # the training stack: only for configs that train

  for name in config_flag_names():
    cfg = FLAGS[name].value
    if all(section in cfg for section in ("model", "train", "opt", "taper", "mesh")):
      devices = cfg.mesh.data * cfg.mesh.fsdp if cfg.mesh.data > 0 and cfg.mesh.fsdp > 0 else 1
      run_config.validate(cfg, devices)


def train(argv: list[str], cfg: Any, workdir: str, stop_after: int | None) -> dict:
  """The body of a training entry point: checks, multi-host start, `loop.run`, the results printed on process 0."""
  import jax  # the training stack: only for the entry points that train
  from tapernorm_jax.storage import run_files
  from tapernorm_jax.train import loop, processes

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if stop_after is not None and stop_after < 1:
    raise app.UsageError(f"--stop_after={stop_after}: must be a step >= 1 (leave it out to train to the end)")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save step at INFO; our own progress goes to the bar
  processes.initialize(cfg.mesh)  # with mesh.distributed: one process per host (or per GPU)
  try:
    results = loop.run(cfg, workdir, stop_after=stop_after)
  except Exception:
    processes.settle()  # a collective failed as another process was lost: that process's line and exit 1, not this
    raise
  if jax.process_index() == 0:
    print(json.dumps(results, indent=2))
    print(f"run directory: {run_files.workdir_path(workdir)}")
  return results
