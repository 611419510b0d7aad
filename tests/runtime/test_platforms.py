"""platforms.py: on a host without a TPU, an entry point keeps jax from starting libtpu (and its start-up errors)."""

import importlib.util
import os
import subprocess
import sys

import pytest

from tapernorm_jax.runtime import platforms
from locations import ROOT


def fake_host(root, vendors=(), nodes=()):
  """A sysfs/dev tree under `root` with PCI devices of `vendors` and device nodes `nodes`."""
  for i, vendor in enumerate(vendors):
    device = root / "sys" / "bus" / "pci" / "devices" / f"0000:00:0{i}.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
  for node in nodes:
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / node).write_text("")
  return str(root)


def installed(*modules):
  """find_spec that reports `modules` (and libtpu) as installed, nothing else."""
  return lambda name: object() if name in ("libtpu", *modules) else None


def test_the_platforms_follow_the_host(tmp_path, monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", installed("jax_cuda12_plugin"))
  cpu_only = fake_host(tmp_path / "cpu", vendors=["0x8086", "0x1af4"])
  env = {}
  assert platforms.without_absent_tpu(env, cpu_only) == "" and env == {"JAX_PLATFORMS": "cpu"}  # no GPU node
  gpu = fake_host(tmp_path / "gpu", vendors=["0x10de"], nodes=["nvidia0", "nvidiactl"])
  env = {}
  assert platforms.without_absent_tpu(env, gpu) == "" and env == {"JAX_PLATFORMS": "cuda,cpu"}
  tpu = fake_host(tmp_path / "tpu", vendors=["0x1ae0"])
  env = {}
  assert platforms.without_absent_tpu(env, tpu) == "this host has a TPU" and env == {}
  env = {"JAX_PLATFORMS": "tpu"}
  assert platforms.without_absent_tpu(env, cpu_only) == "JAX_PLATFORMS is set" and env == {"JAX_PLATFORMS": "tpu"}
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  env = {}
  assert platforms.without_absent_tpu(env, cpu_only) == "libtpu is not installed" and env == {}


@pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None or platforms.tpu_on_host(),
  reason="needs libtpu installed on a host without a TPU",
)
def test_an_entry_point_without_jax_platforms_starts_jax_without_libtpu_s_errors():
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  script = "import experiments, os, jax; jax.devices(); print(os.environ['JAX_PLATFORMS'], jax.default_backend())"
  done = subprocess.run(
    [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True
  )
  assert done.stdout.split() == ["cpu", "cpu"] and "TPU" not in done.stderr, done.stderr
