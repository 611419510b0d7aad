"""The accelerator check's CPU smoke run, end to end through its entry point (what a GPU/TPU user runs in full)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_smoke_run_writes_the_report_with_tests_and_benchmarks(tmp_path):
  out = tmp_path / "check"
  proc = subprocess.run([sys.executable, "-m", "experiments.accelerator_check", "--smoke", f"--out={out}"], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  assert results["tests"]["passed"] == results["tests"]["tests"] > 0 and not results["tests"]["failed"]
  assert results["attention"]["auto_fp32_T512"] == "blocked"  # this CPU's automatic attention
  assert [row["case"] for row in results["train"]["rows"]][0] == "baseline" and results["train"]["rows"][0][
      "tokens_per_s"] > 0
  forms = results["inference"]["forward"][0]["forms"]
  assert set(forms) == {"baseline", "unfused", "folded", "identity"} and forms["folded"]["median"] > 0
  report = (out / "report.md").read_text()
  assert "paper folded (H100)" in report and "Train-step throughput" in report
