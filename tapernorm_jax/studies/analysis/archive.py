"""A study's records, small enough to commit: the files a report reads (`report.RECORDS`: the study's grid,
prediction and throughput, each complete run's results, config and cell record) with each run's history thinned as
the report reads it; no checkpoints. Copied back into a study directory the runs count as done, so a sweep started in
a fresh checkout trains only the cells they lack."""

import os
import shutil

from tapernorm_jax.storage.run_files import write_text_atomically
from tapernorm_jax.studies import manifest
from tapernorm_jax.studies.analysis import run_rows
from tapernorm_jax.studies.analysis.report import RECORDS

POINTS = 500  # history records kept a run (every diagnostics record and the last too)
HISTORY = "metrics.jsonl"  # of RECORDS, the one saved thinned


def save(workdir: str, dest: str, max_points: int = POINTS) -> list[str]:
  """Copies every complete run of the study in `workdir` into `dest`, replacing older copies; the cells copied."""
  if not os.path.isdir(workdir) or manifest.read_manifest(workdir) is None:
    raise ValueError(f"--workdir={workdir}: no study here (no {manifest.MANIFEST}); give a sweep's --workdir")
  os.makedirs(dest, exist_ok=True)
  copy_present(workdir, dest, RECORDS)
  saved = []
  for name in sorted(os.listdir(workdir)):
    run_dir = os.path.join(workdir, name)
    if not run_rows.is_run_dir(run_dir) or manifest.cell_status(run_dir).state != "complete":
      continue
    out = os.path.join(dest, name)
    os.makedirs(out, exist_ok=True)
    copy_present(run_dir, out, [name for name in RECORDS if name != HISTORY])
    lines = [line if line.endswith("\n") else line + "\n" for line, _ in run_rows.metrics_lines(run_dir, max_points)]
    write_text_atomically(os.path.join(out, HISTORY), "".join(lines))
    saved.append(name)
  return saved


def restore(archive: str, workdir: str) -> tuple[list[str], list[str]]:
  """Copies each archived run that `workdir` lacks into it (and the study's files it lacks); (the cells restored,
  the cells left as `workdir` has them)."""
  if not os.path.isdir(archive) or manifest.read_manifest(archive) is None:
    raise ValueError(f"--restore_from={archive}: no archived study here (no {manifest.MANIFEST}); give a --save_to")
  os.makedirs(workdir, exist_ok=True)
  copy_present(archive, workdir, [f for f in RECORDS if not os.path.exists(os.path.join(workdir, f))])
  restored, kept = [], []
  for name in sorted(os.listdir(archive)):
    source = os.path.join(archive, name)
    if not run_rows.is_run_dir(source):
      continue
    if os.path.exists(os.path.join(workdir, name)):
      kept.append(name)
    else:
      shutil.copytree(source, os.path.join(workdir, name))
      restored.append(name)
  return restored, kept


def copy_present(source: str, dest: str, names: tuple[str, ...] | list[str]) -> None:
  """Copies those of `names` that are files in `source` into `dest`."""
  for name in names:
    if os.path.isfile(os.path.join(source, name)):
      shutil.copyfile(os.path.join(source, name), os.path.join(dest, name))
