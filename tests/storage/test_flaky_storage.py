"""A gs:// run or study directory on flaky storage: transient errors are retried whole, with backoff, and logged; an
upload cut off mid-object is sent again whole; an error that lasts stops with one line naming the object, and no
results.json is written; a permanent error is not retried.

The fake bucket is test_cloud_workdir's, made flaky: `Faults` decides, per upload (`put_file`) or download (`open`
to read) of each object, whether it fails, before any byte or after half the object. The retries' waits are 0 s.
"""

import collections
import json
import logging
import os
import pathlib
import re
from collections.abc import Callable

import numpy as np
import pytest
from fsspec.registry import _registry as fsspec_registry  # monkeypatched: restored after the test

import test_cloud_workdir as cloud
from etils.epath import backend as epath_backend
from tapernorm_jax import cli
from tapernorm_jax.storage import run_files, integrity, retries
from tapernorm_jax.studies import manifest
from tapernorm_jax.studies.launch import grid, runner
from tapernorm_jax.studies.analysis import report
from tapernorm_jax.train import loop
from tapernorm_jax.train.checkpoint import Checkpointer
from tapernorm_jax.train.metrics import MetricsWriter, read_jsonl

gcs, compile_cache = cloud.gcs, cloud.compile_cache  # the fixtures, for this module's tests
Rule = Callable[[str, int], BaseException | None]  # (object, how many times it was tried so far, this one included)


class Faults:
  """Which uploads and downloads fail: `uploads`/`downloads` return the error to raise, or None; with `partial`, an
  upload writes half the object before it fails."""

  def __init__(self):
    self.uploads: Rule = lambda name, n: None
    self.downloads: Rule = lambda name, n: None
    self.partial = False
    self.tries: collections.Counter = collections.Counter()  # ("up"/"down", object) -> calls
    self.calls = 0  # uploads so far, all objects
    self.partials: list[bytes] = []  # what a cut-off upload had left under the object's name
    self.root = pathlib.Path()  # the bucket store's local root


class FlakyGcs(cloud.FakeGcs):
  """FakeGcs whose uploads and downloads fail as `faults` says."""

  faults = Faults()

  def put_file(self, lpath, rpath, **kwargs):
    name = os.fspath(rpath).split("://", 1)[-1]
    self.faults.calls += 1
    self.faults.tries["up", name] += 1
    error = self.faults.uploads(name, self.faults.tries["up", name])
    if error is not None and self.faults.partial:  # a naive store: what was sent shows under the name
      with open(lpath, "rb") as f:
        data = f.read()
      with self.open(name, "wb") as out:
        out.write(data[: len(data) // 2])
      self.faults.partials.append(self.cat_file(name))
    if error is not None:
      raise error
    return super().put_file(lpath, rpath, **kwargs)

  def open(self, path, mode="rb", *args, **kwargs):
    if "r" in mode:
      name = os.fspath(path).split("://", 1)[-1]
      self.faults.tries["down", name] += 1
      if (error := self.faults.downloads(name, self.faults.tries["down", name])) is not None:
        raise error
    return super().open(path, mode, *args, **kwargs)


@pytest.fixture
def flaky(gcs, monkeypatch, caplog):
  """The fake bucket, flaky as the returned `Faults` says (nothing fails until a test says so); retries wait 0 s."""
  faults = Faults()
  faults.root = gcs
  monkeypatch.setattr(FlakyGcs, "faults", faults)
  for protocol in FlakyGcs.protocol:
    monkeypatch.setitem(fsspec_registry, protocol, FlakyGcs)
  epath_backend._FileSystemSpecBackend._get_filesystem.cache_clear()
  monkeypatch.setenv(retries.BACKOFF_ENV, "0")
  monkeypatch.delenv(retries.ATTEMPTS_ENV, raising=False)
  caplog.set_level(logging.WARNING, logger=retries.__name__)
  yield faults
  epath_backend._FileSystemSpecBackend._get_filesystem.cache_clear()


def retry_lines(caplog) -> list[str]:
  """The retries' log lines."""
  return [r.getMessage() for r in caplog.records if r.name == retries.__name__]


def test_the_backoff_doubles_up_to_its_cap():
  assert [retries.delay_s(n, 1.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


class HttpError(Exception):
  """gcsfs's HttpError, as far as the retries look: a code."""

  def __init__(self, code: int):
    super().__init__(f"HTTP error, {code}")
    self.code = code


@pytest.mark.parametrize(
  "error, transient",
  [
    (ConnectionResetError("reset by peer"), True),
    (TimeoutError("timed out"), True),
    (OSError("I/O error"), True),
    (HttpError(503), True),
    (HttpError(429), True),
    (HttpError(408), True),
    (HttpError(404), False),
    (HttpError(400), False),
    (FileNotFoundError("gs://bucket/x"), False),
    (PermissionError("denied"), False),
    (OSError("Forbidden: gs://bucket/x\nno access"), False),
    (OSError(28, "No space left on device"), False),
    (ValueError("Bad Request: gs://BAD_bucket/x\nInvalid bucket name"), False),
    (RuntimeError("a bug"), False),
  ],
)
def test_only_transient_errors_are_retried(error, transient):
  assert retries.transient(error) is transient


def test_bad_settings_are_named(monkeypatch):
  monkeypatch.setenv(retries.ATTEMPTS_ENV, "0")
  with pytest.raises(ValueError, match=r"^TAPERNORM_STORAGE_RETRIES=0: must be a whole number of attempts >= 1"):
    retries.call(lambda: None, "x")
  monkeypatch.setenv(retries.ATTEMPTS_ENV, "2")
  monkeypatch.setenv(retries.BACKOFF_ENV, "soon")
  with pytest.raises(ValueError, match=r"^TAPERNORM_STORAGE_BACKOFF_S=soon: must be seconds between 0 and 30"):
    retries.call(lambda: None, "x")


def test_an_upload_cut_off_mid_object_is_sent_again_whole(flaky, caplog, tmp_path):
  data = np.random.default_rng(0).bytes(3 << 20)
  run_files.workdir_path("gs://bucket/runs/tiny").mkdir(parents=True)
  flaky.partial = True
  flaky.uploads = lambda name, n: ConnectionResetError("connection reset by peer") if n <= 2 else None
  with run_files.atomic_path("gs://bucket/runs/tiny/model.safetensors") as tmp, open(tmp, "wb") as f:
    f.write(data)
  assert [len(p) for p in flaky.partials] == [len(data) // 2] * 2  # the fake showed the cut-off object
  assert (flaky.root / "bucket/runs/tiny/model.safetensors").read_bytes() == data
  assert flaky.tries["up", "bucket/runs/tiny/model.safetensors"] == 3
  lines = retry_lines(caplog)
  assert len(lines) == 2 and all("\n" not in line for line in lines)
  assert lines[0] == (
    "gs://bucket/runs/tiny/model.safetensors: upload failed (attempt 1 of 5): ConnectionResetError: "
    "connection reset by peer; trying again in 0.0 s"
  )


def test_trees_and_mirrors_are_retried_both_ways(flaky, caplog, tmp_path):
  flaky.uploads = lambda name, n: TimeoutError("timed out") if n == 1 else None
  flaky.downloads = lambda name, n: ConnectionError("dropped") if n == 1 and name.endswith(".txt") else None
  local = tmp_path / "tree"
  (local / "figures").mkdir(parents=True)
  (local / "report.md").write_text("# report\n")
  (local / "figures" / "a.txt").write_text("a\n")
  run_files.upload_tree(local, run_files.workdir_path("gs://bucket/studies/s"))
  back = run_files.download_tree(run_files.workdir_path("gs://bucket/studies/s"), tmp_path / "back")
  assert (back / "report.md").read_text() == "# report\n" and (back / "figures" / "a.txt").read_text() == "a\n"
  mirror = run_files.Mirror(run_files.workdir_path("gs://bucket/studies/s/cell"))
  mirror.download("log.txt")  # none yet
  (mirror.local / "log.txt").write_text("line 1\n")
  mirror.upload()
  again = run_files.Mirror(run_files.workdir_path("gs://bucket/studies/s/cell"))
  again.download("log.txt")
  assert (again.local / "log.txt").read_text() == "line 1\n"
  assert sorted(line.split(" failed")[0] for line in retry_lines(caplog)) == [
    "gs://bucket/studies/s/cell/log.txt: download",
    "gs://bucket/studies/s/cell/log.txt: upload",
    "gs://bucket/studies/s/figures/a.txt: download",
    "gs://bucket/studies/s/figures/a.txt: upload",
    "gs://bucket/studies/s/report.md: upload",
  ]


def test_study_records_go_through_the_retries(flaky, caplog, tmp_path):
  flaky.uploads = lambda name, n: HttpError(503) if n == 1 else None
  cells = grid.expand({"name": "tiny", "seeds": (0,), "grids": [dict(variants=["baseline"], sizes=["cpu"])]})
  study = "gs://bucket/studies/tiny"
  manifest.write_manifest(study, {"name": "tiny"}, cells)
  run_dir = f"{study}/{cells[0].name}"
  run_files.workdir_path(run_dir).mkdir(parents=True, exist_ok=True)
  manifest.write_record(run_dir, {"status": "running"})
  with runner.cell_log(run_dir) as log:
    log.write("started\n")
  root = flaky.root / "bucket" / "studies" / "tiny"
  assert [c["name"] for c in json.load(open(os.path.join(root, "sweep.json")))["cells"]] == [cells[0].name]
  assert json.load(open(os.path.join(root, cells[0].name, "cell.json"))) == {"status": "running"}
  assert open(os.path.join(root, cells[0].name, "log.txt")).read() == "started\n"
  assert len(retry_lines(caplog)) == 3 and all("HttpError: HTTP error, 503" in line for line in retry_lines(caplog))
  flaky.downloads = lambda name, n: TimeoutError("timed out") if n == 1 and name.endswith("sweep.json") else None
  report.copy_records(run_files.workdir_path(study), tmp_path / "records")  # what a report of the study reads first
  assert json.loads((tmp_path / "records" / "sweep.json").read_text()) == json.loads((root / "sweep.json").read_text())
  assert retry_lines(caplog)[-1].startswith("gs://bucket/studies/tiny/sweep.json: download failed (attempt 1 of 5)")


def test_a_permanent_error_is_not_retried(flaky, caplog):
  flaky.uploads = lambda name, n: PermissionError(f"gs://{name}: 403 Forbidden, the caller lacks objects.create")
  with pytest.raises(PermissionError, match=r"^gs://bucket/runs/tiny/config.json: 403 Forbidden, the caller lacks"):
    run_files.write_json_atomically("gs://bucket/runs/tiny/config.json", {"a": 1})
  assert flaky.tries["up", "bucket/runs/tiny/config.json"] == 1 and not retry_lines(caplog)


def test_an_error_that_lasts_stops_the_command_in_one_line(flaky, caplog, capsys):
  flaky.uploads = lambda name, n: ConnectionRefusedError("connection refused")

  def main(argv):
    run_files.write_json_atomically("gs://bucket/runs/tiny/results.json", {"complete": True})

  with pytest.raises(SystemExit) as exited:
    cli.guard(main)(["train"])
  assert exited.value.code == 1 and flaky.tries["up", "bucket/runs/tiny/results.json"] == 5
  error = capsys.readouterr().err
  assert error.count("\n") == 1 and error.startswith(
    "error: gs://bucket/runs/tiny/results.json: upload failed 5 times over 0 s, the last with "
    "ConnectionRefusedError: connection refused; the storage is unreachable or failing"
  ), error
  assert len(retry_lines(caplog)) == 4
  assert not (flaky.root / "bucket" / "runs" / "tiny" / "results.json").exists()


def test_metrics_that_cannot_be_uploaded_are_not_swallowed(flaky):
  run_files.workdir_path("gs://bucket/runs/m").mkdir(parents=True, exist_ok=True)
  flaky.uploads = lambda name, n: TimeoutError("timed out") if name.endswith("metrics.jsonl") else None
  writer = MetricsWriter("gs://bucket/runs/m", tensorboard=False)
  writer.write(0, {"loss": 1.0})
  with pytest.raises(retries.StorageError, match=r"^gs://bucket/runs/m/metrics.jsonl: upload failed 5 times"):
    writer.close()


@pytest.mark.slow  # three tiny runs: about a minute on 2 cores
def test_a_run_on_flaky_storage_ends_as_a_clean_one(flaky, compile_cache, caplog, tmp_path):
  data_dir = str(tmp_path / "data")
  clean = loop.run(cloud.config(data_dir), "gs://bucket/runs/clean")
  every_third = lambda name, n: ConnectionResetError("reset") if flaky.calls % 3 == 0 else None
  flaky.uploads = lambda name, n: (
    ConnectionResetError("reset") if name.endswith("/results.json") else every_third(name, n)
  )
  with pytest.raises(
    retries.StorageError,
    match=r"^gs://bucket/runs/tiny/results.json: upload failed 5 times over "
    r"\d+ s, the last with ConnectionResetError: reset; ",
  ):
    loop.run(cloud.config(data_dir), cloud.WORKDIR)
  remote = flaky.root / "bucket" / "runs" / "tiny"
  assert not (remote / "results.json").exists()  # the run's end was never reported
  assert Checkpointer(f"{cloud.WORKDIR}/checkpoints").all_steps()[-1] == 8
  failed = len(retry_lines(caplog))
  assert any(not line.startswith("gs://bucket/runs/tiny/results.json") for line in retry_lines(caplog))
  assert failed > 4 and all(
    re.fullmatch(
      r"gs://\S+: upload failed \(attempt \d of 5\): ConnectionResetError: reset; "
      r"trying again in 0\.0 s",
      line,
    )
    for line in retry_lines(caplog)
  )
  flaky.uploads = every_third
  results = loop.run(cloud.config(data_dir), cloud.WORKDIR)  # the same command again: resumes at the end
  assert len(retry_lines(caplog)) > failed
  assert results["resumed_from"] == 8 and results["complete"]
  same = ("final_val_loss", "eval_losses", "steps", "tokens", "params", "complete")
  assert {k: results[k] for k in same} == {k: clean[k] for k in same}
  saved, problem = integrity.unseal(json.loads((remote / "results.json").read_text()))
  assert not problem and {k: saved[k] for k in same} == {k: clean[k] for k in same}
  losses = lambda run: [
    (r["step"], r["loss"], r.get("val_loss")) for r in read_jsonl(f"gs://bucket/runs/{run}/metrics.jsonl")
  ]
  assert losses("tiny") == losses("clean") and len(losses("tiny")) == 8
