"""The accelerator check: its CPU smoke run end to end through its entry point (what a GPU/TPU user runs in full),
where its tests run, and its refusal of tests that ran elsewhere than its benchmarks."""

import json
import os
import subprocess
import sys

import pytest

from tapernorm_jax.benchmarks import accelerator
from locations import ROOT, run_without_checkout


@pytest.mark.slow  # 25–80 s on 2 cores: CI runs it after the default suite
def test_smoke_run_writes_the_report_with_tests_and_benchmarks(tmp_path):
  out = tmp_path / "check"
  proc = subprocess.run(
    [sys.executable, "-m", "experiments.accelerator_check", "--smoke", f"--out={out}"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  assert results["tests"]["passed"] == results["tests"]["tests"] > 0 and not results["tests"]["failed"]
  assert results["platform"] == "cpu" and results["placement_problems"] == []
  assert [r["backend"] for r in results["tests"]["processes"]] == ["cpu"]  # one process (-n 0), on this backend
  assert results["attention"]["auto_fp32_T512"] == "blocked"  # this CPU's automatic attention
  train = results["train"]["rows"]
  assert train[0]["case"] == "baseline" and train[0]["tokens_per_s"] > 0
  peak = results["train"]["peak"]  # on a CPU, its measured GEMM rate
  assert "measured float32 GEMM rate" in peak["source"]
  assert train[0]["mfu"] == pytest.approx(train[0]["tokens_per_s"] * train[0]["flops_per_token"] / peak["flops"])
  forms = results["inference"]["forward"][0]["forms"]
  assert set(forms) == {"baseline", "fixed", "folded", "identity", "dyt", "derf", "baseline_every_position"}
  assert forms["folded"]["median"] > 0
  assert "skipped" in results["peer"] or "table" in results["peer"]  # skipped where torch is not installed
  assert set(results["part_seconds"]) == {"tests", "train", "inference", "peer"}
  report = (out / "report.md").read_text()
  assert "paper folded (H100)" in report and "Train-step throughput" in report and "MFU" in report
  assert "Tests ran on cpu" in report and "Time per part:" in report


def recorded_devices(tmp_path, **env: str | None) -> list[dict]:
  """The device records of one pytest subprocess running one small test, with `env` changed (None: unset)."""
  devices_dir = tmp_path / "devices"
  changed = {**os.environ, "TAPERNORM_TEST_DEVICES_DIR": str(devices_dir)}
  for key, value in env.items():
    if value is None:
      changed.pop(key, None)
    else:
      changed[key] = value
  proc = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *accelerator.SMOKE_TESTS],
    cwd=ROOT,
    env=changed,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stdout[-3000:]
  return accelerator.read_device_records(str(devices_dir))


def test_tests_use_fake_cpu_devices_unless_a_backend_is_asked_for(tmp_path):
  # Nothing asked (as on a GPU/TPU host before this fix): 8 fake CPU devices, whatever the host has.
  [forced] = recorded_devices(tmp_path / "unset", XLA_FLAGS=None, JAX_PLATFORMS=None, TAPERNORM_TEST_BACKEND=None)
  assert (forced["backend"], forced["device_count"]) == ("cpu", 8)
  # The check's request: jax's own default backend and devices (on this CPU-only host, its one CPU device).
  [asked] = recorded_devices(tmp_path / "default", XLA_FLAGS=None, JAX_PLATFORMS=None, TAPERNORM_TEST_BACKEND="default")
  assert (asked["backend"], asked["device_count"]) == ("cpu", 1)


def test_tests_on_another_platform_than_the_benchmarks_fail_the_check(tmp_path):
  tests = accelerator.run_tests(accelerator.Settings(smoke=True), str(tmp_path))
  assert tests["returncode"] == 0 and accelerator.placement_problems("cpu", tests) == []
  [problem] = accelerator.placement_problems("gpu", tests)  # as if the benchmarks had run on a GPU
  assert "ran on cpu" in problem and "the benchmarks on gpu" in problem
  results = {
    "date": "2026-12-01",
    "platform": "gpu",
    "placement_problems": [problem],
    "tests": tests,
    "hardware": {"backend": "gpu", "device": "NVIDIA H200", "device_count": 1, "jax": "0", "python": "3"},
    "attention": {"auto_bf16_T512": "cudnn"},
  }
  assert not accelerator.ok(results)
  assert "TESTS RAN ON ANOTHER PLATFORM THAN THE BENCHMARKS" in accelerator.markdown(results)
  assert accelerator.placement_problems("cpu", {**tests, "processes": []})  # no record: nothing is proven


def test_without_a_checkout_the_check_runs_its_benchmarks_and_says_why_the_tests_did_not(tmp_path):
  # As from a wheel in an empty directory: configs/ and experiments/ unimportable, no tests/ beside the package.
  script = (
    "from tapernorm_jax.benchmarks import accelerator\n"
    f"accelerator.ROOT = {str(tmp_path)!r}\n"
    "s = accelerator.Settings(smoke=True, train=False, inference=False)\n"
    "results = accelerator.run(s, 'out')\n"
    "print(accelerator.ok(results), results['tests'], results['peer'])\n"
    "print(accelerator.markdown(results))\n"
  )
  done = run_without_checkout(script, tmp_path)
  assert "\nTrue {'not_run': 'no checkout" in done.stdout, done.stdout
  assert f"Tests: not run: {accelerator.NO_CHECKOUT}." in done.stdout
