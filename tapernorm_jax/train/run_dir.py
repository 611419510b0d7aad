"""A run directory's files: config.json (a resume refuses a changed model), metrics.jsonl cut back to the
checkpoint a run resumes from, cpu_paths.json (the kernel choice a resume keeps), results.json sealed with its hash,
log.txt; only process 0 writes. The directory may be local or a URL (`run_files.workdir_path`)."""

import dataclasses
import json
import os
import tempfile
from typing import Any

import jax
import ml_collections
from etils import epath
from tqdm import tqdm

from tapernorm_jax.model import ModelConfig
from tapernorm_jax.model.config import EXECUTION_FIELDS
from tapernorm_jax.storage import integrity, run_files
from tapernorm_jax.storage.run_files import write_json_atomically, write_text_atomically
from tapernorm_jax.train.metrics import METRICS_FILE

PATHS_FILE = "cpu_paths.json"  # the CPU paths a run started with (train/kernel_choice.py)
LOG_FILE = "log.txt"  # what a run logs that is not for the terminal (Orbax's records); a study cell's output too
RESULTS_SCHEMA = 1  # bump when results.json changes meaning; the study tools read it


def log(message: str) -> None:
  """Prints on the first process, without breaking the progress bar."""
  if jax.process_index() == 0:
    tqdm.write(message)


class RunDir:
  """The files of one run directory; only process 0 writes."""

  def __init__(self, workdir: str | os.PathLike):
    self.path = run_files.workdir_path(workdir)
    self.writer = jax.process_index() == 0
    check_directory(self.path, "--workdir")

  def file(self, name: str) -> epath.Path:
    """The path of `name` inside the run directory."""
    return self.path / name

  def log_file(self) -> str:
    """Where this process logs what is not for the terminal: LOG_FILE here (log.process<N>.txt beside it on the
    others); in the system's temporary directory for a run at a URL (objects cannot be appended to)."""
    name = LOG_FILE if self.writer else f"log.process{jax.process_index()}.txt"
    if run_files.is_url(self.path):
      return os.path.join(tempfile.gettempdir(), f"tapernorm-{os.getpid()}-{name}")
    return str(self.file(name))

  def check_config(self, cfg: ml_collections.ConfigDict) -> None:
    """On resume, refuses a model that differs from the saved one (before anything is read or written), but for how
    its blocks run (`EXECUTION_FIELDS`: the checkpoint's tree is the same scanned or unrolled, with any remat)."""
    path = self.file("config.json")
    if path.exists():
      saved = json.loads(path.read_text())["model"]
      now = cfg.model.to_dict()
      # As the model reads them: a field the saved file lacks (written before it existed) is its default, a tuple
      # read back from JSON a list.
      as_read = lambda items: dataclasses.asdict(ModelConfig.from_config({k: v for k, v in items.items() if k in now}))
      before, after = as_read(saved), as_read(now)
      differing = {k: (saved.get(k), now[k]) for k in now if before.get(k) != after.get(k)}
      for k in EXECUTION_FIELDS:
        if k in differing:
          log(
            f"resuming with model.{k}={now[k]!r} (saved with {differing.pop(k)[0]!r}): the same model, run differently"
          )
      if differing:
        raise ValueError(
          f"--workdir={self.path} holds a run whose model config differs: "
          + ", ".join(f"model.{k}: saved {a!r} vs now {b!r}" for k, (a, b) in differing.items())
          + ". Use a new --workdir, or the saved config to resume."
        )

  def write_config(self, cfg: ml_collections.ConfigDict) -> None:
    """Saves the resolved config (an unchanged file is left as it is)."""
    path, resolved = self.file("config.json"), json.loads(cfg.to_json_best_effort())
    if path.exists() and json.loads(path.read_text()) == resolved:
      return
    if self.writer:
      write_json_atomically(path, resolved)

  def truncate_metrics(self, step: int) -> None:
    """Drops metric records from `step` on (left by a run that died after its last checkpoint), and every record from
    a torn or damaged line on, saying so."""
    path = self.file(METRICS_FILE)
    if not (self.writer and path.exists()):
      return
    records, damage = integrity.read_lines(path)
    if damage:
      last = max([r["step"] for r in records if r["step"] < step], default=-1)
      gap = f"; steps {last + 1}–{step - 1} now have no record" if last < step - 1 else ""
      log(f"{path}: {damage}; kept the verified records before it and dropped the rest{gap}")
    write_text_atomically(path, "".join(integrity.checked_line(r) for r in records if r["step"] < step))

  def started_paths(self) -> str | None:
    """The CPU paths this run started with (`cpu_paths.json`), which a resume keeps; None for a new run."""
    path = self.file(PATHS_FILE)
    return json.loads(path.read_text())["name"] if path.exists() else None

  def write_paths(self, choice: dict[str, Any]) -> None:
    """Records the CPU paths a new run starts with (train/kernel_choice.py)."""
    if self.writer and not self.file(PATHS_FILE).exists():
      write_json_atomically(self.file(PATHS_FILE), choice)

  def write_results(self, results: dict[str, Any]) -> None:
    """Writes results.json atomically, sealed with the hash of its content (integrity.seal)."""
    if self.writer:
      write_json_atomically(self.file("results.json"), integrity.seal(results))


def check_directory(path: epath.Path, flag: str) -> None:
  """Raises NotADirectoryError naming `flag` when `path`, or (locally) a directory above it, is a file."""
  if path.is_file():
    raise NotADirectoryError(f"{flag}={path} is a file; give a directory")
  if run_files.is_url(path):  # an object store has no files standing in for directories
    return
  parent = path.parent
  while not parent.exists() and parent.parent != parent:
    parent = parent.parent
  if parent.is_file():
    raise NotADirectoryError(f"{flag}={path}: {parent} is a file, so no directory can be made there; give another path")
