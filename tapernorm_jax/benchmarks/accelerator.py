"""One check of a GPU or TPU host: the accelerator-relevant tests, then the train-step and inference benchmarks.

The tests run in a pytest subprocess on this host's default backend (bf16 numerics of the norms and
the fold, every attention implementation the backend offers against the reference, sharded steps
over all local devices); every test process records the devices it ran on, and the check fails when
they are not the benchmarks' platform. The benchmarks run in this process in the backend's default
dtype (bf16 on accelerators): the train step with its model FLOPs utilisation, the inference grid and,
where PyTorch and transformers are importable, the paper's Table 3 grid beside Hugging Face eager and
`torch.compile` (experiments/benchmark_peer.py, in a subprocess). The result is one JSON and one markdown
report, with the paper's H100 numbers beside the measured ones and each part's time. `smoke` shrinks every
part to a CPU run of about a minute (what CI executes).
"""

import dataclasses
import datetime
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from typing import Any

import jax

from tapernorm_jax.runtime import hardware
from tapernorm_jax.benchmarks import decode as decode_bench
from tapernorm_jax.benchmarks import decode_tables
from tapernorm_jax.benchmarks import train as train_bench
from tapernorm_jax.model import attention, sharding

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout, if installed from one
# The tests that say whether this backend computes what the CPU does: attention implementations against the
# reference, bf16 norms and folds, sharding over every local device, decode against the full forward.
TESTS = (
  "tests/model/test_attention.py",
  "tests/model/test_norms.py",
  "tests/taper/test_fold.py",
  "tests/model/test_sharding.py",
  "tests/inference/test_decode.py",
)
SMOKE_TESTS = ("tests/model/test_attention.py::test_auto_picks_the_backend_s_kernel",)
# What the subprocesses share the accelerator with: no process may take most of its memory up front.
SHARED_DEVICE_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


@dataclasses.dataclass
class Settings:
  """What to run; `smoke` is the CPU preset CI uses."""

  smoke: bool = False
  tests: bool = True
  train: bool = True
  inference: bool = True
  peer: bool = True
  test_timeout_s: int = 300
  peer_timeout_s: int = 240
  checkout: str = ""  # a clone of the repository (its tests/ and experiments/); "": the one installed from, if any

  def __post_init__(self):
    for name in ("test_timeout_s", "peer_timeout_s"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
    if self.checkout and not os.path.isfile(os.path.join(self.checkout, "tests", "conftest.py")):
      what = "does not exist" if not os.path.exists(self.checkout) else "is not a clone of tapernorm_jax (no tests/)"
      raise ValueError(
        f"checkout={self.checkout}: {what}; give the directory of a clone of the repository, or "
        "leave it out to use the one this package was installed from"
      )


def checkout_dir(s: Settings) -> str | None:
  """The checkout whose tests and peer script to run: `s.checkout`, else the one this package lives in; None when
  the package was installed without one (a wheel: the check then runs its benchmarks only)."""
  directory = s.checkout or ROOT
  return directory if os.path.isfile(os.path.join(directory, "tests", "conftest.py")) else None


NO_CHECKOUT = (
  "no checkout: the tests and the peer script live in the repository, not in the installed package; "
  "pass --checkout=DIR of a clone to run them"
)


def run_tests(s: Settings, out_dir: str) -> dict[str, Any]:
  """Runs the accelerator test subset in a subprocess on this host's default backend (tests/conftest.py forces
  8 fake CPU devices only when no backend is asked for); counts from its JUnit XML, and the devices every test
  process recorded. Skipped, with the reason, without a checkout."""
  root = checkout_dir(s)
  if root is None:
    return {"not_run": NO_CHECKOUT}
  report, devices_dir = os.path.join(out_dir, "tests.xml"), os.path.join(out_dir, "test_devices")
  shutil.rmtree(devices_dir, ignore_errors=True)
  env = {
    **os.environ,
    **SHARED_DEVICE_ENV,
    "TAPERNORM_TEST_BACKEND": "default",
    "TAPERNORM_TEST_DEVICES_DIR": devices_dir,
  }
  cmd = [
    sys.executable,
    "-m",
    "pytest",
    "-q",
    "-n",
    str(test_workers(s.smoke)),
    "-p",
    "no:cacheprovider",
    f"--junitxml={report}",
    *(SMOKE_TESTS if s.smoke else TESTS),
  ]
  t0 = time.time()
  try:
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=s.test_timeout_s)
  except subprocess.TimeoutExpired:
    return {
      "command": " ".join(cmd),
      "timed_out": True,
      "wall_s": time.time() - t0,
      "processes": read_device_records(devices_dir),
    }
  counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
  failed = []
  if os.path.exists(report):
    suite = ElementTree.parse(report).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {key: int(suite.get(key, 0)) for key in counts}
    failed = [
      f"{case.get('classname')}::{case.get('name')}"
      for case in suite.iter("testcase")
      if case.find("failure") is not None or case.find("error") is not None
    ]
  return {
    "command": " ".join(cmd),
    "returncode": proc.returncode,
    "wall_s": time.time() - t0,
    **counts,
    "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
    "failed": failed,
    "processes": read_device_records(devices_dir),
    "output_tail": proc.stdout[-3000:] + proc.stderr[-2000:],
  }


def test_workers(smoke: bool) -> int:
  """pytest-xdist workers for the test subset: 2 (compilation is single-threaded), one process where a TPU admits
  only one (and for the smoke run's single test)."""
  return 0 if smoke or jax.default_backend() == "tpu" else 2


def read_device_records(devices_dir: str) -> list[dict[str, Any]]:
  """The devices each test process ran on (tests/conftest.py writes one JSON per process: hardware.describe(), pid,
  xdist worker and devices)."""
  records = []
  for path in sorted(glob.glob(os.path.join(devices_dir, "*.json"))):
    with open(path) as f:
      records.append(json.load(f))
  return records


def placement_problems(platform: str, tests: dict[str, Any] | None) -> list[str]:
  """Why the tests' results do not speak for `platform` (where the benchmarks ran); empty when they do."""
  if not tests or "not_run" in tests:
    return []
  records = tests.get("processes") or []
  if not records:
    return ["no test process recorded its devices (tests/conftest.py did not run, or the tests never started)"]
  return [
    f"test process {r['worker']} (pid {r['pid']}) ran on {r['backend']} ({r['device_count']} × "
    f"{r['device']}), the benchmarks on {platform}"
    for r in records
    if r["backend"] != platform
  ]


def run_peer(s: Settings, out_dir: str) -> dict[str, Any]:
  """The paper's Table 3 grid (30M, forward) beside Hugging Face eager and torch.compile in the backend's dtype,
  by experiments/benchmark_peer.py in a subprocess; skipped (with the reason) where torch or transformers is
  missing."""
  missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
  if missing:
    return {"skipped": f"{' and '.join(missing)} not importable (pip install -e '.[peer]' adds them)"}
  root = checkout_dir(s)
  if root is None:
    return {"skipped": NO_CHECKOUT}
  peer_dir = os.path.join(out_dir, "peer")
  preset = ["--quick"] if s.smoke else ["--repeats=3", "--warmup=1", "--min_sample_s=0.25"]
  cmd = [sys.executable, "-m", "experiments.benchmark_peer", "--modes=forward", f"--out={peer_dir}", *preset]
  t0 = time.time()
  try:
    proc = subprocess.run(
      cmd, cwd=root, env={**os.environ, **SHARED_DEVICE_ENV}, capture_output=True, text=True, timeout=s.peer_timeout_s
    )
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {s.peer_timeout_s} s: {' '.join(cmd)}"}
  if proc.returncode:
    return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-1500:]}"}
  with open(os.path.join(peer_dir, "table.md")) as f:
    table = f.read()
  with open(os.path.join(peer_dir, "results.json")) as f:
    return {"command": " ".join(cmd), "wall_s": time.time() - t0, "table": table, "results": json.load(f)}


def train_settings(smoke: bool) -> train_bench.Settings:
  """The paper's 30M model at batch 16 × 512 tokens (rounded up to the device count), or a tiny smoke shape."""
  n = jax.device_count()  # the batch splits over every device
  if smoke:
    return train_bench.Settings(sizes=("cpu",), batch=n, seq=32, steps=1, repeats=1)
  return train_bench.Settings(sizes=("30m",), batch=-(-16 // n) * n, seq=512, steps=5, repeats=3)


def inference_settings(smoke: bool) -> decode_bench.Settings:
  """The paper's grid (30M, B ∈ {1, 4} × T ∈ {128, 256, 512}, decode at B ∈ {1, 4}), or the quick preset."""
  if smoke:
    return decode_bench.Settings(
      **{**decode_bench.QUICK, "size": "cpu", "modes": ("forward",), "repeats": 1, "warmup": 0}
    )
  return decode_bench.Settings(repeats=3, min_sample_s=0.3)


def run(s: Settings, out_dir: str) -> dict[str, Any]:
  """Every selected part; a failing part is recorded and the others still run."""
  os.makedirs(out_dir, exist_ok=True)
  backend = jax.default_backend()
  results: dict[str, Any] = {
    "date": datetime.date.today().isoformat(),
    "hardware": hardware.describe(),
    "settings": dataclasses.asdict(s),
    "platform": backend,
    "part_seconds": {},
    "attention": {
      "auto_bf16_T512": attention.resolve("auto", "bfloat16", 512, sharding.platform_of(None)),
      "auto_fp32_T512": attention.resolve("auto", "float32", 512, sharding.platform_of(None)),
    },
  }
  print(
    f"accelerator check on {hardware.one_line(results['hardware'])} ({backend}); attention auto → "
    f"{results['attention']['auto_bf16_T512']} (bf16)",
    flush=True,
  )
  parts = [
    ("tests", s.tests, lambda: run_tests(s, out_dir)),
    ("train", s.train, lambda: train_bench.run(train_settings(s.smoke))),
    ("inference", s.inference, lambda: decode_bench.run(inference_settings(s.smoke))),
    ("peer", s.peer, lambda: run_peer(s, out_dir)),
  ]
  for name, wanted, part in parts:
    if not wanted:
      continue
    t0 = time.time()
    try:
      results[name] = part()
    except Exception as e:  # one broken part must not hide the others' numbers
      results[name] = {"error": f"{type(e).__name__}: {e}"}
    results["part_seconds"][name] = time.time() - t0
    print(f"{name}: {results['part_seconds'][name]:.0f} s", flush=True)
  results["placement_problems"] = placement_problems(backend, results.get("tests"))
  return results


def tested_on(tests: dict[str, Any]) -> str:
  """`gpu (1 × NVIDIA H200)` for every distinct platform and device set the test processes recorded."""
  seen = sorted({f"{r['backend']} ({r['device_count']} × {r['device']})" for r in tests.get("processes") or []})
  return ", ".join(seen) or "unknown"


def markdown(results: dict[str, Any]) -> str:
  """The report: device, where the tests ran, test counts, the train-step, inference and peer tables (paper's H100
  beside), each part's time."""
  lines = [
    f"# Accelerator check, {results['date']}",
    "",
    f"Device: {hardware.one_line(results['hardware'])}, "
    f"jax {results['hardware']['jax']}, Python {results['hardware']['python']}. Attention `auto` picks "
    f"`{results['attention']['auto_bf16_T512']}` for bf16 at T = 512.",
    "",
  ]
  problems = results.get("placement_problems") or []
  if problems:
    lines += [
      "**TESTS RAN ON ANOTHER PLATFORM THAN THE BENCHMARKS**: their results say nothing about this device.",
      "",
      *[f"* {p}" for p in problems],
      "",
    ]
  tests = results.get("tests")
  if tests:
    where = f"Tests ran on {tested_on(tests)}; benchmarks on {results['platform']}."
    if "not_run" in tests:
      lines += [f"Tests: not run: {tests['not_run']}.", ""]
    elif tests.get("timed_out"):
      lines += [f"Tests: **timed out** after {tests['wall_s']:.0f} s. {where}", ""]
    else:
      lines += [
        f"Tests: {tests['passed']} passed, {tests['failures'] + tests['errors']} failed, {tests['skipped']} "
        f"skipped ({tests['wall_s']:.0f} s). {where}"
        + (f" Failed: {', '.join(tests['failed'])}" if tests['failed'] else ""),
        "",
      ]
  parts = (
    ("train", "Train", train_bench.markdown),
    ("inference", "Inference", decode_tables.markdown),
    ("peer", "Beside PyTorch (Hugging Face Llama, forward)", lambda part: part["table"]),
  )
  for name, title, render in parts:
    part = results.get(name)
    if part:
      body = (
        f"**error**: {part['error']}"
        if "error" in part
        else f"Not run: {part['skipped']}."
        if "skipped" in part
        else render(part)
      )
      lines += [f"## {title}", "", body, ""]
  seconds = results.get("part_seconds") or {}
  if seconds:
    lines += [
      "Time per part: "
      + ", ".join(f"{name} {t:.0f} s" for name, t in seconds.items())
      + f"; {sum(seconds.values()):.0f} s in all.",
      "",
    ]
  return "\n".join(lines)


def ok(results: dict[str, Any]) -> bool:
  """Whether every part that ran succeeded (tests passed on the benchmarks' platform, benchmarks finished)."""
  tests = results.get("tests")
  if tests and "not_run" not in tests and (tests.get("timed_out") or tests.get("returncode") != 0):
    return False
  if results.get("placement_problems"):
    return False
  return not any("error" in results.get(name, {}) for name in ("train", "inference", "peer"))
