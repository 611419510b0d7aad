"""Metrics to JSON lines (always) and TensorBoard event files (no TensorFlow needed)."""

import json
import math
import os
import time
from typing import Any, Mapping

import jax
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


def to_python(value: Any) -> Any:
  """A JSON-friendly scalar (non-finite floats become strings so the file stays valid JSON)."""
  value = np.asarray(value).item() if hasattr(value, "shape") or isinstance(value, np.generic) else value
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class MetricsWriter:
  """Appends `{"step": ..., **metrics}` to `metrics.jsonl` and the same scalars to TensorBoard."""

  def __init__(self, workdir: str, tensorboard: bool = True):
    self.active = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._file = open(self.path, "a") if self.active else None
    self._tb = EventFileWriter(os.path.join(workdir, "tensorboard")) if (self.active and tensorboard) else None

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

  def close(self) -> None:
    """Flushes and closes both files."""
    if self._file:
      self._file.close()
    if self._tb:
      self._tb.close()


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """All records of a metrics file."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
