"""Metrics to JSON lines (always) and TensorBoard event files (no TensorFlow needed).

In a remote run directory (`gs://...`) both are written to a local `files.Mirror` and uploaded whole (an object
store cannot append, and TensorBoard's writer writes local files only): every `upload_every_s` seconds, at every
checkpoint (`flush`) and on `close`. A resumed run first downloads metrics.jsonl to append to it.
"""

import json
import math
import os
import time
from typing import Any, Mapping

import jax
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tapernorm_jax import files

METRICS_FILE = "metrics.jsonl"


def to_python(value: Any) -> Any:
  """A JSON-friendly scalar (non-finite floats become strings so the file stays valid JSON)."""
  value = np.asarray(value).item() if hasattr(value, "shape") or isinstance(value, np.generic) else value
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class MetricsWriter:
  """Appends `{"step": ..., **metrics}` to `metrics.jsonl` and the same scalars to TensorBoard."""

  def __init__(self, workdir: str | os.PathLike, tensorboard: bool = True, upload_every_s: float = 60.0):
    self.active = jax.process_index() == 0
    root = files.workdir_path(workdir)
    self.path = root / METRICS_FILE
    self._mirror = files.Mirror(root) if self.active and files.is_url(root) else None
    if self._mirror:
      self._mirror.download(METRICS_FILE)
    local = self._mirror.local if self._mirror else root
    self._file = (local / METRICS_FILE).open("a") if self.active else None
    self._tb = EventFileWriter(os.fspath(local / "tensorboard")) if (self.active and tensorboard) else None
    self.upload_every_s, self._uploaded_at = upload_every_s, time.time()

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Writes one record; arrays are fetched to the host."""
    if not self.active:
      return
    record = {"step": int(step), **{k: to_python(v) for k, v in jax.device_get(dict(metrics)).items()}}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    if self._tb is not None:
      values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in record.items()
                if k != "step" and isinstance(v, (int, float))]
      self._tb.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                         summary=summary_pb2.Summary(value=values)))
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
    """Flushes and closes both files (uploading them, in a remote run directory)."""
    if self._file:
      self._file.close()
    if self._tb:
      self._tb.close()
    if self._mirror:
      self._mirror.close()


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """All records of a metrics file (local or remote)."""
  with files.workdir_path(path).open() as f:
    return [json.loads(line) for line in f if line.strip()]
