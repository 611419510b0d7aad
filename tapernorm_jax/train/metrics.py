"""Metrics to JSON lines (always), TensorBoard event files (no TensorFlow needed) and the trackers of
`tracking.py` (Weights & Biases).

In a remote run directory (`gs://...`) both are written to a local `run_files.Mirror` and uploaded whole (an object
store cannot append, and TensorBoard's writer writes local files only): every `upload_every_s` seconds, at every
checkpoint (`flush`) and on `close`. A resumed run first downloads metrics.jsonl to append to it.

Every record of metrics.jsonl carries the CRC-32 of its own line (`integrity.checked_line`), so a torn or changed line
is found even where it still parses (`integrity.read_lines`).
"""

import math
import os
import time
from collections.abc import Sequence
from typing import Any, Mapping

import jax
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tapernorm_jax.storage import run_files, integrity
from tapernorm_jax.train.tracking import Tracker

METRICS_FILE = "metrics.jsonl"


# measured on the host: differ between equal runs
HOST_KEYS = ("tokens_per_s", "data_wait_frac", "host_rss_mb", "host_cpu_s")


def of_the_run(record: Mapping[str, Any]) -> dict[str, Any]:
  """A record without its host measurements (HOST_KEYS): what two runs of the same steps share, bit for bit."""
  return {k: v for k, v in record.items() if k not in HOST_KEYS}


def to_python(value: Any) -> Any:
  """A JSON-friendly scalar (non-finite floats become strings so the file stays valid JSON)."""
  value = np.asarray(value).item() if hasattr(value, "shape") or isinstance(value, np.generic) else value
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
  """A record's numbers, without its step: what TensorBoard and the trackers receive."""
  return {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}


class MetricsWriter:
  """Appends `{"step": ..., **metrics}` to `metrics.jsonl` and hands the same scalars to TensorBoard and to each
  tracker."""

  def __init__(
    self,
    workdir: str | os.PathLike,
    tensorboard: bool = True,
    upload_every_s: float = 60.0,
    trackers: Sequence[Tracker] = (),
  ):
    self.active = jax.process_index() == 0
    self.trackers = list(trackers)  # the caller makes them on the first process only
    root = run_files.workdir_path(workdir)
    self.path = root / METRICS_FILE
    self._mirror = run_files.Mirror(root) if self.active and run_files.is_url(root) else None
    if self._mirror:
      self._mirror.download(METRICS_FILE)
    local = self._mirror.local if self._mirror else root
    self._file = (local / METRICS_FILE).open("a") if self.active else None
    self._tb = EventFileWriter(os.fspath(local / "tensorboard")) if (self.active and tensorboard) else None
    self.upload_every_s, self._uploaded_at = upload_every_s, time.time()
    if self.trackers:  # what a tracker lacks of the run so far (a killed session's steps it never stored)
      for record in read_jsonl(local / METRICS_FILE):
        for tracker in self.trackers:
          tracker.log(record["step"], scalars(record))

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Writes one record; arrays are fetched to the host."""
    if not self.active:
      return
    record = {"step": int(step), **{k: to_python(v) for k, v in jax.device_get(dict(metrics)).items()}}
    line = integrity.checked_line(record)
    with run_files.full_disk_named(f"step {step}'s record", self.path, len(line)):  # a torn line is cut on resume
      self._file.write(line)
      self._file.flush()
    numbers = scalars(record)
    if self._tb is not None:
      values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in numbers.items()]
      self._tb.add_event(
        event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values))
      )
    for tracker in self.trackers:
      tracker.log(int(step), numbers)
    if self._mirror and time.time() - self._uploaded_at >= self.upload_every_s:
      self.flush()

  def flush(self) -> None:
    """Flushes both files (and uploads them, in a remote run directory)."""
    if not self.active:
      return
    self._file.flush()
    if self._tb:
      self._tb.flush()
    if self._mirror:
      self._mirror.upload()
      self._uploaded_at = time.time()

  def close(self) -> None:
    """Flushes and closes both files (uploading them, in a remote run directory) and ends each tracker's run."""
    for tracker in self.trackers:
      tracker.close()
    if self._file:
      self._file.close()
    if self._tb:
      self._tb.close()
    if self._mirror:
      self._mirror.close()


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """All records of a metrics file (local or remote); a torn or damaged line raises integrity.DamagedLinesError naming
  it."""
  records, damage = integrity.read_lines(run_files.workdir_path(path))
  if damage:
    raise integrity.DamagedLinesError(f"{path}: {damage}")
  return records
