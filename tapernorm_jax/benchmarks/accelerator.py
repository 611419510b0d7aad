"""One check of a GPU or TPU host: the accelerator-relevant tests, then the train-step and inference benchmarks.

The tests run in a pytest subprocess (bf16 numerics of the norms and the fold, every attention
implementation the backend offers against the reference, sharded steps over all local devices);
the benchmarks run in this process in the backend's default dtype (bf16 on accelerators). The
result is one JSON and one markdown report, with the paper's H100 numbers beside the measured ones.
`smoke` shrinks every part to a CPU run of about a minute (what CI executes).
"""

import dataclasses
import datetime
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from typing import Any

import jax

from tapernorm_jax import attention, hardware
from tapernorm_jax.benchmarks import decode as decode_bench
from tapernorm_jax.benchmarks import train as train_bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tests that say whether this backend computes what the CPU does: attention implementations against the
# reference, bf16 norms and folds, sharding over every local device, decode against the full forward.
TESTS = ("tests/test_attention.py", "tests/test_norms.py", "tests/test_fold.py", "tests/test_sharding.py",
         "tests/test_decode.py")
SMOKE_TESTS = ("tests/test_attention.py::test_auto_picks_the_backend_s_kernel",)


@dataclasses.dataclass
class Settings:
  """What to run; `smoke` is the CPU preset CI uses."""

  smoke: bool = False
  tests: bool = True
  train: bool = True
  inference: bool = True
  test_timeout_s: int = 300

  def __post_init__(self):
    if self.test_timeout_s < 1:
      raise ValueError(f"test_timeout_s={self.test_timeout_s}: must be >= 1")


def run_tests(s: Settings, out_dir: str) -> dict[str, Any]:
  """Runs the accelerator test subset in a subprocess; counts from its JUnit XML."""
  report = os.path.join(out_dir, "tests.xml")
  cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", f"--junitxml={report}",
         *(SMOKE_TESTS if s.smoke else TESTS)]
  t0 = time.time()
  try:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=s.test_timeout_s)
  except subprocess.TimeoutExpired:
    return {"command": " ".join(cmd), "timed_out": True, "wall_s": time.time() - t0}
  counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
  failed = []
  if os.path.exists(report):
    suite = ElementTree.parse(report).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {key: int(suite.get(key, 0)) for key in counts}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
  return {"command": " ".join(cmd), "returncode": proc.returncode, "wall_s": time.time() - t0, **counts,
          "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"], "failed": failed,
          "output_tail": proc.stdout[-3000:] + proc.stderr[-2000:]}


def train_settings(smoke: bool) -> train_bench.Settings:
  """The paper's 30M model at batch 16 × 512 tokens (rounded up to the device count), or a tiny smoke shape."""
  n = jax.device_count()  # the batch splits over every device
  if smoke:
    return train_bench.Settings(sizes=("cpu",), batch=n, seq=32, steps=1, repeats=1)
  return train_bench.Settings(sizes=("30m",), batch=-(-16 // n) * n, seq=512, steps=5, repeats=3)


def inference_settings(smoke: bool) -> decode_bench.Settings:
  """The paper's grid (30M, B ∈ {1, 4} × T ∈ {128, 256, 512}, decode at B ∈ {1, 4}), or the quick preset."""
  if smoke:
    return decode_bench.Settings(**{**decode_bench.QUICK, "size": "cpu", "modes": ("forward",), "repeats": 1,
                                    "warmup": 0})
  return decode_bench.Settings(repeats=5, min_sample_s=0.5)


def run(s: Settings, out_dir: str) -> dict[str, Any]:
  """Every selected part; a failing part is recorded and the others still run."""
  os.makedirs(out_dir, exist_ok=True)
  backend = jax.default_backend()
  results: dict[str, Any] = {
      "date": datetime.date.today().isoformat(), "hardware": hardware.describe(), "settings": dataclasses.asdict(s),
      "attention": {"auto_bf16_T512": attention.resolve("auto", "bfloat16", 512),
                    "auto_fp32_T512": attention.resolve("auto", "float32", 512)}}
  print(f"accelerator check on {hardware.one_line(results['hardware'])} ({backend}); attention auto → "
        f"{results['attention']['auto_bf16_T512']} (bf16)", flush=True)
  parts = [("tests", s.tests, lambda: run_tests(s, out_dir)),
           ("train", s.train, lambda: train_bench.run(train_settings(s.smoke))),
           ("inference", s.inference, lambda: decode_bench.run(inference_settings(s.smoke)))]
  for name, wanted, part in parts:
    if not wanted:
      continue
    t0 = time.time()
    try:
      results[name] = part()
    except Exception as e:  # one broken part must not hide the others' numbers
      results[name] = {"error": f"{type(e).__name__}: {e}"}
    print(f"{name}: {time.time() - t0:.0f} s", flush=True)
  return results


def markdown(results: dict[str, Any]) -> str:
  """The report: device, test counts, the train-step table and the inference tables (paper's H100 beside)."""
  lines = [f"# Accelerator check, {results['date']}", "", f"Device: {hardware.one_line(results['hardware'])}. "
           f"Attention `auto` picks `{results['attention']['auto_bf16_T512']}` for bf16 at T = 512.", ""]
  tests = results.get("tests")
  if tests:
    if tests.get("timed_out"):
      lines += ["Tests: **timed out**.", ""]
    else:
      lines += [f"Tests: {tests['passed']} passed, {tests['failures'] + tests['errors']} failed, {tests['skipped']} "
                f"skipped ({tests['wall_s']:.0f} s)." + (f" Failed: {', '.join(tests['failed'])}" if tests['failed']
                                                          else ""), ""]
  for name, render in (("train", train_bench.markdown), ("inference", decode_bench.markdown)):
    part = results.get(name)
    if part:
      lines += [f"## {name.capitalize()}", "", f"**error**: {part['error']}" if "error" in part else render(part), ""]
  return "\n".join(lines)


def ok(results: dict[str, Any]) -> bool:
  """Whether every part that ran succeeded (tests passed, benchmarks finished)."""
  tests = results.get("tests")
  if tests and (tests.get("timed_out") or tests.get("returncode") != 0):
    return False
  return not any("error" in results.get(name, {}) for name in ("train", "inference"))
