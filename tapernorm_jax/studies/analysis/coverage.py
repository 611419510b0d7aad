"""How often the fits' intervals hold the truth: studies drawn from known laws with seed noise, fitted as a report
fits them (fits.py), counted. `python -m experiments.fit_coverage` runs it and writes COVERAGE_FILE, which
the report and predictions.json quote beside every interval they print."""

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.studies.analysis import fits

COVERAGE_FILE = os.path.join(os.path.dirname(__file__), "coverage.json")  # the committed measurement
GAP_LAW = (0.05, 0.4)  # a, b: the method's loss is the reference's × (1 + a·(N/N₀)^(−b))
LOSS_LAW = (1.5, 2.0, 0.3)  # E, A, α: L(C) = E + A·(C/C₀)^(−α)
PARAMS = np.geomspace(1e6, 8e6, 4)  # four sizes spanning 8×, as the budget study's ladder
HELD_OUT = 2.0 * PARAMS[-1]  # the size predict-then-check holds out, one step of the ladder on


def training_compute(params: np.ndarray | float) -> np.ndarray | float:
  """6·N FLOPs a token × 20 tokens a parameter."""
  return 120.0 * np.asarray(params) ** 2


COMPUTE = training_compute(PARAMS)


@dataclasses.dataclass
class Setting:
  """One simulated design: seeds per cell, their relative noise, studies drawn, bootstrap resamples per fit."""

  seeds: int = 3
  noise: float = 0.003
  studies: int = 400
  resamples: int = 300
  seed: int = 0


def rate(hits: int, n: int) -> dict[str, float]:
  """A measured share with its binomial standard error."""
  share = hits / n if n else float("nan")
  return {"rate": share, "se": float(np.sqrt(share * (1 - share) / n)) if n else float("nan"), "n": n}


def draw(rng: np.random.Generator, means: np.ndarray, s: Setting) -> list[np.ndarray]:
  """Each cell's seeds: its mean × (1 + noise·Z)."""
  return [m * (1 + s.noise * rng.standard_normal(s.seeds)) for m in means]


def quiet(_: str) -> None:
  """Swallows progress lines."""


READINGS = ("does not fit", "spans 0", "shrinks", "grows")  # what GapFit.reading says, by its key words


def gap_coverage(s: Setting, echo: Callable[[str], None] = quiet, law: tuple[float, float] = GAP_LAW) -> dict[str, Any]:
  """Under the gap law `law`: how often the intervals of a, b and the fitted gap at every size hold the truth, how
  often the lack-of-fit test alarms, and how often the report reads each of READINGS."""
  rng = np.random.default_rng(s.seed)
  a, b = law
  x = PARAMS / PARAMS[0]
  reference_means = LOSS_LAW[0] + LOSS_LAW[1] * (COMPUTE / COMPUTE[0]) ** -LOSS_LAW[2]
  true_gap = a * x**-b
  hits = {"a": 0, "b": 0, "gap at every size": 0, "alarms at p < 0.1": 0, **{f"reads '{w}'": 0 for w in READINGS}}
  for i in range(s.studies):
    fit = fits.gap_fit(
      PARAMS, draw(rng, reference_means * (1 + true_gap), s), draw(rng, reference_means, s), s.resamples, seed=i
    )
    _, low, high = fit.curve(PARAMS)
    hits["a"] += fit.a.spans(a)
    hits["b"] += fit.b.spans(b)
    hits["gap at every size"] += int(np.sum((low <= true_gap) & (true_gap <= high)))
    hits["alarms at p < 0.1"] += fit.lack_of_fit() < 0.1
    hits[f"reads '{next((w for w in READINGS if w in fit.reading()), READINGS[0])}'"] += 1
    if (i + 1) % 100 == 0:
      echo(f"gap law a = {a}, b = {b}: {i + 1} of {s.studies} studies")
  return {name: rate(n, s.studies * (len(PARAMS) if name == "gap at every size" else 1)) for name, n in hits.items()}


def predict_coverage(s: Setting, echo: Callable[[str], None] = quiet) -> dict[str, Any]:
  """How often the measured mean at the held-out size falls inside the interval predicted from the four smaller
  sizes' loss–compute law (the seeds' pooled noise of that mean added, as predict.py does)."""
  rng = np.random.default_rng(s.seed + 1)
  e, big_a, alpha = LOSS_LAW
  law = lambda c: e + big_a * (c / COMPUTE[0]) ** -alpha
  held_out = training_compute(HELD_OUT)
  inside = 0
  for i in range(s.studies):
    cells = draw(rng, law(COMPUTE), s)
    fit = fits.compute_fit(COMPUTE, cells, s.resamples, seed=i)
    measured = float(np.mean(draw(rng, np.array([law(held_out)]), s)[0]))
    inside += fit.predict(held_out, fits.pooled_std(cells) / np.sqrt(s.seeds), seed=i).spans(measured)
    if (i + 1) % 100 == 0:
      echo(f"predict then check: {i + 1} of {s.studies} studies")
  return {"measured mean inside the prediction": rate(inside, s.studies)}


def measure(s: Setting, echo: Callable[[str], None] = quiet) -> dict[str, Any]:
  """Every coverage of one setting, with the setting and the nominal level."""
  return {
    "setting": dataclasses.asdict(s),
    "level": fits.LEVEL,
    "gap_law": list(GAP_LAW),
    "loss_law": list(LOSS_LAW),
    "params": PARAMS.tolist(),
    "held_out_params": HELD_OUT,
    "rates": {
      **gap_coverage(s, echo),
      **predict_coverage(s, echo),
      **{
        f"flat gap (b = 0): {name}": r
        for name, r in gap_coverage(s, echo, (GAP_LAW[0], 0.0)).items()
        if name.startswith("reads")
      },
    },
  }


def markdown(result: dict[str, Any]) -> str:
  """The measured rates beside what they should be."""
  nominal = lambda name: "10%" if name.startswith("alarms") else "—" if "reads" in name else f"{result['level']:.0%}"
  rows = [
    [name, f"{100 * r['rate']:.1f}% ± {100 * r['se']:.1f}", str(r["n"]), nominal(name)]
    for name, r in result["rates"].items()
  ]
  return markdown_table(["interval, test or reading", "measured (± standard error)", "trials", "nominal"], rows)


def sentence(result: dict[str, Any] | None = None) -> str:
  """How often the intervals held the truth in the committed simulation, in words ('' where it is absent)."""
  result = result or committed()
  if not result:
    return ""
  r, s = result["rates"], result["setting"]
  pct = lambda name: f"{100 * r[name]['rate']:.0f}%"
  return (
    f"In {s['studies']:,} simulated studies with a known law (4 sizes spanning 8×, {s['seeds']} seeds, "
    f"{100 * s['noise']:.1f}% seed noise; tapernorm_jax/studies/analysis/coverage.json) the "
    f"{result['level']:.0%} intervals held the "
    f"true a in {pct('a')}, b in {pct('b')} and the gap at a size in {pct('gap at every size')} of them, and "
    f"the measured mean fell inside the predicted interval in {pct('measured mean inside the prediction')}."
  )


def committed() -> dict[str, Any] | None:
  """The committed measurement (COVERAGE_FILE), or None where it is absent."""
  try:
    with open(COVERAGE_FILE) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None
