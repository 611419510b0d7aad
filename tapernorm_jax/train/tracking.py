"""Trackers beside metrics.jsonl and TensorBoard: Weights & Biases through the optional `wandb` extra, behind one seam.

`MetricsWriter` hands every record it writes to each tracker `trackers(cfg, run_dir)` makes. A tracker that fails
(W&B not installed, no login, no network, a bad project name) warns once in one line and is dropped; the training,
its checkpoints and metrics.jsonl go on without it. A resumed run continues the same W&B run (its id is derived from
the run directory) and logs no step twice: a tracker skips the steps its run already holds (the steps trained again,
bit-exact, after the checkpoint resumed from), and at the start it is handed metrics.jsonl's records, so it gets the
steps of a killed session that W&B never stored.
"""

import glob
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from tapernorm_jax.storage import run_files
from tapernorm_jax.errors import UserError

log = logging.getLogger(__name__)

WANDB_DIR = "wandb"  # W&B's own files (a folder per session), inside a local run directory
WANDB_MODES = ("", "online", "offline", "disabled")  # "": W&B's own choice ($WANDB_MODE, else online)
INIT_TIMEOUT_S = 60.0  # how long wandb.init may wait for its server before the tracker gives up
_BAD_PROJECT = re.compile(r"[/\\#?%:]")  # characters W&B refuses in a project name


class TrackerError(UserError, RuntimeError):
  """A tracker that cannot start; the message names the field or the fix."""


class Tracker(Protocol):
  """Receives each record the training loop writes."""

  def log(self, step: int, scalars: Mapping[str, float]) -> None:
    """One step's scalars."""

  def close(self) -> None:
    """Flushes and ends the run."""


def run_id(run_dir: str | os.PathLike) -> str:
  """W&B's run id for a run directory: the same directory (local path or URL) always gives the same id."""
  where = str(run_dir) if run_files.is_url(run_dir) else os.path.realpath(os.fspath(run_dir))
  return "tn-" + hashlib.sha256(where.rstrip("/").encode()).hexdigest()[:20]


def wandb_records(path: str | os.PathLike) -> Iterator[bytes]:
  """The records of a W&B transaction log (`run-<id>.wandb`: a 7-byte header, then LevelDB's log format: 32 KiB
  blocks of chunks, each a 4-byte checksum, 2-byte length, 1-byte type — full, first, middle or last); a torn tail
  ends the iteration."""
  with open(path, "rb") as f:
    data = f.read()
  if data[:4] != b":W&B":
    return
  pos, block, pending = 7, 32768, b""
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # a block's tail too short for a chunk header is padding
      pos += left
      continue
    length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
    if kind == 0 or pos + 7 + length > len(data):
      return
    chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
    if kind == 1:
      yield chunk
    elif kind == 2:
      pending = chunk
    elif kind == 3:
      pending += chunk
    elif kind == 4:
      yield pending + chunk


def wandb_history(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
  """(step, {metric: value}) for each history record of a W&B transaction log."""
  from wandb.proto import wandb_internal_pb2  # the optional extra; only callers that have W&B files get here

  for data in wandb_records(path):
    record = wandb_internal_pb2.Record()
    record.ParseFromString(data)
    if record.WhichOneof("record_type") == "history":
      items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
      yield int(record.history.step.num), {k: v for k, v in items.items() if not k.startswith("_")}


def last_logged_step(wandb_dir: str | os.PathLike, rid: str) -> int:
  """The last step the earlier sessions of W&B run `rid` under `wandb_dir` hold (-1: none); each session is a
  folder `<offline-run|run>-<time>-<rid>` (`latest-run` is a link to one of them)."""
  logs = glob.glob(os.path.join(glob.escape(os.fspath(wandb_dir)), f"*-{rid}", f"run-{rid}.wandb"))
  return max((step for path in logs for step, _ in wandb_history(path)), default=-1)


def brief(error: Exception, limit: int) -> str:
  """An exception's message on one line, at most `limit` characters."""
  return " ".join(str(error).split())[:limit]


class WandbTracker:
  """One W&B run per run directory (project, entity, tags, mode and group from `cfg.tracking`), its config logged
  at the start; resumes the same run and skips the steps it already holds."""

  def __init__(self, tracking: Mapping[str, Any], run_dir: str | os.PathLike, config: Mapping[str, Any]):
    project, mode = wandb_project(tracking), tracking.get("wandb_mode", "")
    if _BAD_PROJECT.search(project):
      raise TrackerError(f"tracking.wandb_project={project!r}: W&B project names cannot contain / \\ # ? % or :")
    try:
      import wandb
    except ImportError:
      raise TrackerError(
        "tracking.wandb_project is set but wandb is not installed: pip install 'tapernorm-jax[wandb]'"
      ) from None
    rid = run_id(run_dir)  # W&B writes into <home>/wandb: the run directory, or a local cache for a URL
    home = os.path.join(run_files.cache_dir(), "wandb", rid) if run_files.is_url(run_dir) else os.fspath(run_dir)
    os.makedirs(home, exist_ok=True)
    held = last_logged_step(os.path.join(home, WANDB_DIR), rid)
    try:
      self.run = wandb.init(
        project=project,
        entity=tracking.get("wandb_entity") or None,
        id=rid,
        resume="allow",
        mode=mode or None,
        group=tracking.get("wandb_group") or None,
        tags=list(tracking.get("wandb_tags", ())) or None,
        name=os.path.basename(os.fspath(run_dir).rstrip("/")),
        dir=home,
        config=dict(config),
        settings=wandb.Settings(console="off", silent=True, init_timeout=INIT_TIMEOUT_S),
      )
    except Exception as e:  # noqa: BLE001 - W&B raises its own kinds (no login, no network, refused)
      where = f"tracking.wandb_project={project!r}, mode={mode or 'W&B default'}"
      raise TrackerError(f"W&B could not start the run ({where}): {brief(e, 300)}") from None
    self.logged_through = max(held, int(self.run.step or 0) - 1)  # a resumed online run knows its step

  def log(self, step: int, scalars: Mapping[str, float]) -> None:
    """Logs the step unless the run holds it already."""
    if step > self.logged_through:
      self.run.log(dict(scalars), step=step)
      self.logged_through = step

  def close(self) -> None:
    """Ends the run (W&B uploads what is left, online)."""
    self.run.finish()


class Guarded:
  """A tracker whose failures warn once and turn it off, so a tracker never stops the training."""

  def __init__(self, name: str, tracker: Tracker | None):
    self.name, self.tracker = name, tracker

  def _call(self, method: str, *args: Any) -> None:
    if self.tracker is None:
      return
    try:
      getattr(self.tracker, method)(*args)
    except Exception as e:  # noqa: BLE001 - any failure of a tracker is reported the same way
      self.tracker = None
      warn(
        f"{self.name} stopped ({type(e).__name__}: {brief(e, 200)}); training goes on, metrics.jsonl has every record"
      )

  def log(self, step: int, scalars: Mapping[str, float]) -> None:
    """Passes the step on."""
    self._call("log", step, scalars)

  def close(self) -> None:
    """Closes the tracker."""
    self._call("close")


def warn(message: str) -> None:
  """One line on stderr, as the run's other warnings (a `warnings` warning showed its source line too)."""
  log.warning(f"tracking: {message}")


def wandb_project(tracking: Mapping[str, Any]) -> str:
  """The W&B project: `tracking.wandb_project`, else $WANDB_PROJECT (how a whole study is switched on); "": none."""
  return tracking.get("wandb_project") or os.environ.get("WANDB_PROJECT", "")


def trackers(cfg: Any, run_dir: str | os.PathLike) -> list[Guarded]:
  """The trackers `cfg.tracking` asks for (W&B where a project is set), each started or, failing that, named in a
  one-line warning and left out."""
  tracking = cfg.get("tracking", {}) if hasattr(cfg, "get") else {}
  if not wandb_project(tracking) or tracking.get("wandb_mode") == "disabled":
    return []
  try:
    return [Guarded("W&B", WandbTracker(tracking, run_dir, cfg.to_dict() if hasattr(cfg, "to_dict") else cfg))]
  except TrackerError as e:
    warn(f"{e}; training goes on without it")
    return []
