"""The peer benchmark's PyTorch-free half (tapernorm_jax/benchmarks/forward.py), its paired ratios, and its entry point
without PyTorch."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from tapernorm_jax.benchmarks.pytorch import forward
from tapernorm_jax.benchmarks.timing import paired_ratio
from locations import ROOT


def test_parity_passes_within_tolerance_and_refuses_beyond():
  ours_BxV = np.random.default_rng(0).normal(size=(2, 7)).astype(np.float32)
  checked = forward.parity(ours_BxV, ours_BxV + 1e-5)
  assert checked["max_abs_diff"] == pytest.approx(1e-5, rel=1e-2) and checked["tolerance"] == forward.PARITY_TOLERANCE
  with pytest.raises(forward.ParityError, match=r"differ from this project's baseline form by up to 0\.01"):
    forward.parity(ours_BxV, ours_BxV + np.float32(0.01))
  with pytest.raises(forward.ParityError, match="shape"):
    forward.parity(ours_BxV, ours_BxV[:1])


def test_agreement_counts_leading_tokens_equal_in_every_row():
  ours_BxN = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
  assert forward.agreement(ours_BxN, ours_BxN.copy()) == 4
  assert forward.agreement(ours_BxN, np.array([[1, 2, 0, 4], [5, 6, 7, 8]])) == 2
  assert forward.agreement(ours_BxN, ours_BxN[:, :3]) == 0


def test_measure_times_the_runnable_calls_and_keeps_the_reasons():
  s = forward.Settings(size="cpu", repeats=2, warmup=0, min_sample_s=0.0, dtype="float32")
  measured = forward.measure(
    {"hf_eager": lambda: 1, "hf_compiled": "InductorError: no compiler", "folded": lambda: 2}, work=100, s=s
  )
  assert measured["hf_compiled"] == {"na": "InductorError: no compiler"}
  assert len(measured["folded"]["seconds"]) == 2 and measured["folded"]["median"] > 0


def test_markdown_shows_ratios_and_the_reason_for_n_a(capsys):
  drift = (1.0, 1.6, 0.9)  # the machine's speed round by round, shared by every contender: cancels from the ratios
  rate = lambda median: {
    "median": median,
    "min": median,
    "max": median,
    "spread": 0.02,
    "seconds": [f / median for f in drift],
  }
  results = {
    "date": "2026-01-01",
    "params": 1000,
    "parity": {"max_abs_diff": 2e-7},
    "load_average": 0.5,
    "hardware": {"backend": "cpu", "cpu": "Some CPU", "cpu_count": 2, "l3_cache": "32M", "jax": "0.10.2"},
    "peer": {"torch": "2.13.0", "transformers": "5.24.0", "device": "cpu", "threads": 2},
    "settings": {"size": "30m", "variant": "internal_taper", "dtype": "float32", "repeats": 7},
    "forward": [
      {
        "B": 1,
        "T": 128,
        "contenders": {
          "hf_eager": rate(2000.0),
          "hf_compiled": {"na": "Boom: why"},
          "baseline": rate(3000.0),
          "folded": rate(4000.0),
          "baseline_every_position": rate(2500.0),
        },
      }
    ],
    "decode": [
      {
        "B": 1,
        "prompt": 128,
        "new_tokens": 128,
        "greedy_agreement": {"hf_eager": 128},
        "contenders": {
          "hf_eager": rate(100.0),
          "hf_compiled": rate(200.0),
          "baseline": rate(300.0),
          "folded": rate(400.0),
        },
      }
    ],
  }
  table = forward.markdown(results)
  assert (
    "| 1 | 128 | 2.00 ± 1.0% | n/a | 3.00 ± 1.0% | 4.00 ± 1.0% | 2.50 ± 1.0% | 2.00× (2.00–2.00) | – | "
    "1.25× (1.25–1.25) |"
  ) in table  # the last: the baseline doing HF's work (every block on every position)
  assert "* HF torch.compile: n/a (Boom: why)" in table
  rates = " | ".join(f"{x}.00 ± 1.0%" for x in (100, 200, 300, 400))
  assert f"| 1 | 128 | 128 | {rates} | 4.00× (4.00–4.00) | 2.00× (2.00–2.00) | 128/128 |" in table
  forward.log_row("forward B=1 T=128", results["forward"][0])  # every contender's line, the every-position one too
  assert "ours baseline, every position 2,500 tok/s" in capsys.readouterr().out


def test_paired_ratio_cancels_a_slowdown_shared_by_a_round_and_ignores_one_outlier():
  drift = [1.0, 2.5, 0.7, 1.9, 1.2]  # seconds scale round by round: the medians of the rates do not see it
  ours, theirs = [0.5 * f for f in drift], [0.8 * f for f in drift]
  r = paired_ratio(ours, theirs)
  assert r["min"] == pytest.approx(1.6) and r["max"] == pytest.approx(1.6)
  theirs[3] *= 3  # one round where only the peer was disturbed
  r = paired_ratio(ours, theirs)
  assert r["median"] == pytest.approx(1.6) and r["max"] == pytest.approx(4.8)
  with pytest.raises(ValueError):
    paired_ratio(ours, theirs[:-1])


@pytest.mark.parametrize(
  "changes, message",
  [
    (dict(modes=("prefill",)), r"modes=\['prefill'\]: unknown"),
    (dict(variant="baseline"), "a model with tapered norms"),
    (dict(threads=-1), "threads=-1: must be >= 0"),
  ],
)
def test_settings_name_the_bad_field(changes, message):
  with pytest.raises(ValueError, match=message):
    forward.Settings(**changes)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is installed here")
def test_without_pytorch_the_entry_point_says_how_to_install_it():
  done = subprocess.run(
    [sys.executable, "-m", "experiments.benchmark_peer", "--quick"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 2
  assert done.stderr.strip() == (
    "error: experiments/benchmark_peer.py needs PyTorch and transformers (torch is not "
    "installed); install the peer extra: pip install -e '.[peer]' -c constraints.txt"
  )
