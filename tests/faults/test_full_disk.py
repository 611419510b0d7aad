"""A full disk, on a small filesystem made for the test (a tmpfs with a size limit; skipped where this process may not
mount one): the save that hits it stops the run in one line naming what, the space needed and the space free; the
newest complete checkpoint stays complete, nothing half-written counts as a checkpoint, and once space is freed the
same command resumes bit-exact. A study's records and its report, the same."""

import os
import re
import shutil
import subprocess
import tempfile

import pytest
from etils import epath
from PIL import Image

from configs import base
from tapernorm_jax import cli
from tapernorm_jax.storage import run_files, integrity
from tapernorm_jax.studies import manifest
from tapernorm_jax.studies.analysis import report
from tapernorm_jax.train import checkpoint, loop
from tapernorm_jax.train.checkpoint import Checkpointer
from tapernorm_jax.train.metrics import of_the_run, read_jsonl
from multihost import TINY

CHANGES = {**TINY, "train.steps": 12, "checkpoint.every": 4, "train.diag_every": 4, "taper.gate_warmup_frac": 0.25}


@pytest.fixture
def small_disk(tmp_path):
  """A 8 MB tmpfs mounted for the test (root only); skipped, with the reason, where it cannot be mounted."""
  mount = tmp_path / "disk"
  mount.mkdir()
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, text=True)
  if done.returncode:
    pytest.skip(
      f"cannot mount a small tmpfs to fill here ({(done.stderr or 'mount failed').strip()}); the test "
      "needs root (or CAP_SYS_ADMIN)"
    )
  yield mount
  subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: os.PathLike, leave: int) -> str:
  """Writes a ballast file that leaves `leave` bytes free on `directory`'s device; returns its path."""
  ballast = os.path.join(directory, "ballast")
  with open(ballast, "wb") as f:
    f.write(b"\0" * max(shutil.disk_usage(directory).free - leave, 0))
  return ballast


def untimed(workdir: str) -> list[dict]:
  return [of_the_run(r) for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[str, dict]:
  """An uninterrupted run on an ordinary disk: its directory and results."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  return workdir, loop.run(config(str(tmp_path_factory.mktemp("data"))), workdir)


def config(data_dir: str):
  return base.override(base.get_config("all_taper"), {**CHANGES, "data.data_dir": data_dir})


@pytest.mark.slow  # three short runs
def test_a_checkpoint_save_that_fills_the_disk_stops_in_one_line_and_the_run_resumes_bit_exact(
  small_disk, tmp_path, reference
):
  cfg = lambda: config(str(tmp_path / "data"))
  reference_dir, reference = reference
  workdir = str(small_disk / "run")
  loop.run(cfg(), workdir, stop_after=8)  # checkpoints at 4 and 8
  ballast = fill(small_disk, leave=64_000)  # room for metrics and events, not for the next checkpoint
  with pytest.raises(run_files.DiskFullError) as full:
    loop.run(cfg(), workdir)
  message = str(full.value)
  state_bytes = reference["params"] * 4 * 3 + 4 * 9  # parameters, Adam's two moments, the small scalars
  assert message.startswith(f"no space left for the checkpoint at step 12 in {workdir}/checkpoints (it needs "), message
  assert "\n" not in message and "free). Free space there" in message
  needed = float(message.split("(it needs ")[1].split(" kB")[0]) * 1000
  assert state_bytes * 0.9 < needed < state_bytes * 1.5, (needed, state_bytes)
  assert " spare; " in message  # checked before Orbax started: no step 12 begun, no writer thread's traceback
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4", "8"]
  checkpoints = Checkpointer(os.path.join(workdir, "checkpoints"))
  assert checkpoints.all_steps() == [4, 8]
  for step in (4, 8):
    assert not integrity.check(epath.Path(workdir, "checkpoints", str(step)))
  checkpoints.close()
  os.remove(ballast)
  results = loop.run(cfg(), workdir)
  assert results["resumed_from"] == 8 and results["final_val_loss"] == reference["final_val_loss"]
  assert untimed(workdir) == untimed(reference_dir)


@pytest.mark.slow  # two short runs
def test_a_disk_that_fills_mid_save_is_one_line_and_orbax_s_tracebacks_go_to_a_file(
  small_disk, tmp_path, monkeypatch, capfd
):
  cfg = lambda: config(str(tmp_path / "data"))
  workdir = str(small_disk / "run")
  loop.run(cfg(), workdir, stop_after=8)
  fill(small_disk, leave=64_000)
  monkeypatch.setattr(checkpoint, "SAVE_SPARE_BYTES", -(1 << 40))  # the room check passes: Orbax's writers meet it
  capfd.readouterr()
  with pytest.raises(run_files.DiskFullError, match="^no space left for the checkpoint at step 12 "):
    loop.run(cfg(), workdir)
  terminal = capfd.readouterr().err
  assert "Traceback" not in terminal and "RESOURCE_EXHAUSTED" not in terminal, terminal[-3000:]
  # the run's log.txt is on the full disk: the records went to the temporary directory's file
  logged = open(os.path.join(tempfile.gettempdir(), f"tapernorm-orbax-{os.getpid()}.log")).read()
  # whichever of Orbax's writers meets the full disk first: TensorStore's (RESOURCE_EXHAUSTED) or a metadata file's
  disk_full = "RESOURCE_EXHAUSTED" in logged or "[Errno 28] No space left" in logged
  assert "Traceback" in logged and disk_full, logged[-3000:]
  assert Checkpointer(os.path.join(workdir, "checkpoints")).all_steps() == [4, 8]


def test_a_study_record_that_fills_the_disk_is_named_and_the_old_one_kept(small_disk, capsys):
  run_dir = str(small_disk / "cell")
  os.makedirs(run_dir)
  manifest.write_record(run_dir, {"status": "running"})
  ballast = fill(small_disk, leave=0)
  with pytest.raises(SystemExit) as stopped:  # as an entry point says it: one line, exit 1 (the run stopped)
    cli.guard(lambda argv: manifest.write_record(run_dir, {"status": "complete", "note": "x" * 10_000}))(["sweep"])
  said = capsys.readouterr().err
  assert stopped.value.code == 1 and said.count("\n") == 1
  assert re.match(r"^error: no space left for cell.json in .*cell \(it needs 10.0 kB; 0 B free\)", said), said
  assert manifest.read_record(run_dir) == {"status": "running"} and os.listdir(run_dir) == ["cell.json"]
  os.remove(ballast)
  manifest.write_record(run_dir, {"status": "complete"})
  assert manifest.read_record(run_dir) == {"status": "complete"}


def test_a_report_that_fills_the_disk_is_named_and_written_whole_once_space_is_freed(small_disk, reference):
  study = small_disk / "study"
  shutil.copytree(reference[0], study / "run", ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
  ballast = fill(small_disk, leave=20_000)  # room for the report's text, not for its figures
  full = r"^no space left for \S+\.png in .*figures \(it needs more than the [\d.]+ k?B written; "
  with pytest.raises(run_files.DiskFullError, match=full):
    report.write_report(str(study))
  assert not [name for _, _, names in os.walk(study) for name in names if ".tmp-" in name]
  os.remove(ballast)
  report.write_report(str(study))
  for name in os.listdir(study / "figures"):
    with Image.open(study / "figures" / name) as image:
      image.load()
