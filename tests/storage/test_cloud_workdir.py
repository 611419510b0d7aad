"""A run directory on an object store (`--workdir=gs://...`): train, resume bit-exactly, export and load, offline.

gs:// is served by an in-test fsspec filesystem over a temporary directory (in production gcsfs serves it).
etils.epath reaches it through its own fsspec backend, as it reaches GCS, so only run-directory I/O that goes
through epath finds the files: a leftover os-level call on the URL would touch ./gs:/... in the working directory,
which the test keeps empty and checks. The fake refuses appends, as GCS does. Orbax's two calls that bypass epath
for gs:// are pointed at the same directory: TensorStore's kvstore (its own GCS driver) and the bucket lookup.
A persistent compilation cache, for this test only, lets the second and third runs reuse the first one's programs.
"""

import csv
import io
import json
import os
import types

import jax
import numpy as np
import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import _registry as fsspec_registry  # monkeypatched: restored after the test
from fsspec.registry import known_implementations
from jax.experimental.compilation_cache import compilation_cache
from orbax.checkpoint._src.path import gcs_utils
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from configs import base
from tapernorm_jax import data
from tapernorm_jax.storage.run_files import LocalPathError, MissingFilesystemError, workdir_path
from tapernorm_jax.inference import export, forms, loading
from tapernorm_jax.studies import manifest
from tapernorm_jax.studies.launch import grid, runner
from tapernorm_jax.studies.analysis import report, run_rows
from tapernorm_jax.train import loop
from tapernorm_jax.train.checkpoint import Checkpointer
from tapernorm_jax.train.metrics import read_jsonl

# 8 steps: warmup and calibration over steps 0-1, then the taper; stopped at 5, inside it. Diagnostics only at the end
# and no g = 0 fixed step: fewer compilations (three runs compile their own steps).
TINY = {
  "model.D": 32,
  "model.H": 4,
  "model.L": 2,
  "model.T": 32,
  "model.V": 512,
  "train.steps": 8,
  "train.batch_size": 8,
  "train.log_every": 4,
  "train.diag_every": 8,
  "train.eval_batches": 1,
  "checkpoint.every": 4,
  "taper.gate_warmup_frac": 0.25,
  "train.fixed_step": False,
  "opt.lr": 1e-3,
  "data.synthetic_train_stories": 200,
  "data.synthetic_valid_stories": 40,
}
STOP = 5
WORKDIR = "gs://bucket/runs/tiny"


class FakeGcs(DirFileSystem):
  """gs://bucket/path as <root>/bucket/path; objects cannot be appended to, as on GCS."""

  protocol = ("gs", "gcs")
  cachable = False
  root = ""

  def __init__(self, *args, **kwargs):
    super().__init__(path=self.root, fs=LocalFileSystem())

  def open(self, path, mode="rb", *args, **kwargs):
    if "a" in mode:
      raise NotImplementedError(f"{path}: GCS objects cannot be appended to")
    return super().open(path, mode, *args, **kwargs)


@pytest.fixture
def gcs(tmp_path, monkeypatch):
  """The fake bucket store's local root; the working directory is an empty one, checked empty at the end."""
  root = tmp_path / "gcs"
  root.mkdir()
  monkeypatch.setattr(FakeGcs, "root", str(root))
  for protocol in FakeGcs.protocol:
    monkeypatch.setitem(fsspec_registry, protocol, FakeGcs)
  monkeypatch.setattr(
    gcs_utils, "get_kvstore_for_gcs", lambda path: {"driver": "file", "path": str(root / path.removeprefix("gs://"))}
  )
  monkeypatch.setattr(gcs_utils, "get_bucket", lambda name: types.SimpleNamespace(hierarchical_namespace_enabled=False))
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  epath_backend._FileSystemSpecBackend._get_filesystem.cache_clear()
  yield root
  epath_backend._FileSystemSpecBackend._get_filesystem.cache_clear()
  assert not os.listdir(cwd), "something wrote the gs:// run directory through the local filesystem"


@pytest.fixture
def compile_cache(tmp_path):
  """JAX's persistent compilation cache in a temporary directory, for one test (the previous settings restored)."""
  settings = {
    "jax_compilation_cache_dir": str(tmp_path / "jax_cache"),
    "jax_persistent_cache_min_compile_time_secs": 0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
  }
  previous = {name: getattr(jax.config, name) for name in settings}
  for name, value in settings.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()
  yield
  for name, value in previous.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()


def config(data_dir: str, **changes):
  """The tiny config with `changes` (dotted keys) applied."""
  return base.override(base.get_config("all_taper"), {**TINY, "data.data_dir": data_dir, **changes})


@pytest.mark.slow  # 25–80 s on 2 cores: CI runs it after the default suite
def test_a_gs_workdir_trains_resumes_bit_exactly_and_exports(gcs, compile_cache, tmp_path):
  data_dir = str(tmp_path / "data")
  local_dir = str(tmp_path / "local")
  uninterrupted = loop.run(config(data_dir), local_dir)
  first = loop.run(config(data_dir), WORKDIR, stop_after=STOP)
  remote = gcs / "bucket" / "runs" / "tiny"
  assert first["steps"] == STOP and not (remote / "results.json").exists()
  assert Checkpointer(f"{WORKDIR}/checkpoints").all_steps() == [4, STOP]
  results = loop.run(config(data_dir), WORKDIR)
  assert results["resumed_from"] == STOP and results["final_val_loss"] == uninterrupted["final_val_loss"]
  records = read_jsonl(f"{WORKDIR}/metrics.jsonl")
  assert [r["loss"] for r in records] == [r["loss"] for r in read_jsonl(os.path.join(local_dir, "metrics.jsonl"))]
  assert [r["step"] for r in records] == list(range(8))
  saved = json.loads((remote / "results.json").read_text())
  assert saved["complete"] and saved["steps"] == 8 and saved["final_val_loss"] == results["final_val_loss"]
  assert json.loads((remote / "config.json").read_text())["model"]["D"] == 32
  assert len(list((remote / "tensorboard").iterdir())) == 2  # one events file per process that wrote
  tb = EventAccumulator(str(remote / "tensorboard"))
  tb.Reload()
  assert sorted(e.step for e in tb.Scalars("loss")) == list(range(8))
  assert Checkpointer(f"{WORKDIR}/checkpoints").all_steps() == [4, STOP, 8] and (remote / "checkpoints" / "8").is_dir()

  loaded = loading.load(WORKDIR)
  assert loaded.tokenizer is not None
  variables, cfg = forms.inference_form(loaded.variables, loaded.model_cfg)
  out = export.save("gs://bucket/exports/tiny", variables, cfg, fold=False, tokenizer=loaded.tokenizer)
  assert str(out) == "gs://bucket/exports/tiny" and export.is_export(out)
  assert sorted(os.listdir(gcs / "bucket" / "exports" / "tiny")) == [
    "config.json",
    "manifest.json",
    "model.safetensors",
    "tokenizer",
    "variables",
  ]
  for source in ("orbax", "safetensors"):
    jax.tree.map(np.testing.assert_array_equal, export.load(out, source).variables, variables)
  again = loading.load(str(out))
  assert again.model_cfg == cfg and again.tokenizer.encode("Once upon a time") == loaded.tokenizer.encode(
    "Once upon a time"
  )


def test_a_url_without_its_filesystem_names_the_extra_to_install(monkeypatch):
  monkeypatch.delitem(fsspec_registry, "gs", raising=False)
  monkeypatch.setitem(known_implementations, "gs", {"class": "no_such_gcsfs.GCSFileSystem", "err": "install gcsfs"})
  with pytest.raises(MissingFilesystemError, match=r"^gs://bucket/run: .*pip install 'tapernorm_jax\[gcs\]'"):
    workdir_path("gs://bucket/run")


def test_local_only_directories_refuse_a_url_by_name(gcs, tmp_path):
  with pytest.raises(LocalPathError, match=r"^data\.data_dir=gs://bucket/cache: must be a local directory"):
    data.prepare(config("gs://bucket/cache").data)
  with pytest.raises(ValueError, match=r"^--workdir=gs://bucket/study: no such directory"):
    report.write_report("gs://bucket/study")  # a study may be at a URL; this one is not there


@pytest.mark.slow  # two tiny cells trained in this process
def test_a_gs_study_runs_skips_what_is_done_and_reports(gcs, tmp_path):
  nested = {}
  for key, value in {**TINY, "data.data_dir": str(tmp_path / "data")}.items():
    section, field = key.split(".")
    nested.setdefault(section, {})[field] = value
  cells = grid.expand(
    {
      "name": "tiny",
      "seeds": (0,),
      "overrides": nested,
      "grids": [dict(variants=["baseline", "all_taper:aux=0"], sizes=["cpu"])],
    }
  )
  study = "gs://bucket/studies/tiny"
  manifest.write_manifest(study, {"name": "tiny"}, cells)
  lines = []
  statuses = runner.run(cells, study, echo=lines.append)
  assert {s.state for s in statuses.values()} == {"complete"}, lines
  remote = gcs / "bucket" / "studies" / "tiny"
  for cell in cells:
    assert json.loads((remote / cell.name / "cell.json").read_text())["status"] == "complete"
    assert f"{cell.variant} [" in (remote / cell.name / "log.txt").read_text()  # uploaded when the cell ended
  again = []
  runner.run(cells, study, echo=again.append)
  assert "2 already done or skipped, 0 to run" in again[0]
  written = report.write_report(study)
  assert written["report"] == f"{study}/report.md" and (written["runs"], written["complete"]) == (2, 2)
  text = (remote / "report.md").read_text()
  assert text.startswith("# Study report: tiny") and "2 of 2 runs complete" in text
  rows = list(csv.DictReader(io.StringIO((remote / "results.csv").read_text())))
  assert len(rows) == 2 and all(row["status"] in run_rows.FINISHED for row in rows)  # six steps: no context learned
  assert sorted(os.listdir(remote / "figures")) == sorted(os.path.basename(f) for f in written["figures"])
