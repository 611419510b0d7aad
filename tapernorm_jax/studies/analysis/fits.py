"""Scaling laws fitted to a study, with scipy: a method's relative gap against parameters, ΔL(N) = a·(N/N₀)^(−b), and
loss against training compute, L(C) = E + A·(C/C₀)^(−α), each by a Huber-loss least squares; intervals by a
parametric bootstrap of the cells' means with the seeds' relative noise pooled over the cells, stretched by t/z for
the noise's degrees of freedom (their coverage measured by simulation: coverage.py); a method's effect as a
compute multiplier against the baseline's law. N₀ and C₀ are the smallest size's, so that a and A are the gap and
excess loss there."""

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from scipy import optimize, stats

LEVEL = 0.9  # the intervals' coverage
HUBER_SCALE = 0.5  # residuals beyond half the data's scale count linearly (an outlying cell pulls less)


@dataclasses.dataclass
class Interval:
  """A fitted number with its bootstrap interval (LEVEL coverage, percentile method)."""

  value: float
  low: float
  high: float

  def spans(self, x: float) -> bool:
    """Whether `x` lies inside the interval."""
    return self.low <= x <= self.high

  def text(self, fmt: str = "{:.3g}") -> str:
    """`1.23 [0.98, 1.51]`."""
    return f"{fmt.format(self.value)} [{fmt.format(self.low)}, {fmt.format(self.high)}]"


def _least_squares(
  residuals: Callable[[np.ndarray], np.ndarray],
  jacobian: Callable[[np.ndarray], np.ndarray],
  start: np.ndarray,
  lower: Sequence[float],
  upper: Sequence[float],
) -> np.ndarray:
  """scipy's bounded least squares with a Huber loss, on residuals already divided by the data's scale."""
  return optimize.least_squares(
    residuals, start, jac=jacobian, bounds=(lower, upper), loss="huber", f_scale=HUBER_SCALE
  ).x


def fit_gap(n: np.ndarray, gap: np.ndarray, start: Sequence[float] | None = None) -> tuple[float, float]:
  """(a, b) of gap ≈ a·(n/min n)^(−b): the gap at the smallest size and how fast it shrinks (b > 0) or grows."""
  x = np.asarray(n, float) / np.min(n)
  y = np.asarray(gap, float)
  scale = max(float(np.max(np.abs(y))), 1e-12)
  if start is None:
    a0 = float(y[np.argmin(x)])
    start = (a0 if a0 != 0 else scale, 0.3)
  residuals = lambda p: (p[0] * x ** -p[1] - y) / scale
  jacobian = lambda p: np.stack([x ** -p[1], -p[0] * x ** -p[1] * np.log(x)], axis=1) / scale
  a, b = _least_squares(residuals, jacobian, np.asarray(start, float), [-np.inf, -3.0], [np.inf, 3.0])
  return float(a), float(b)


def fit_loss_compute(
  c: np.ndarray, loss: np.ndarray, start: Sequence[float] | None = None
) -> tuple[float, float, float]:
  """(E, A, α) of loss ≈ E + A·(c/c_min)^(−α), 0 ≤ E ≤ the lowest loss (the irreducible part), α in (0, 3]."""
  x = np.asarray(c, float) / np.min(c)
  y = np.asarray(loss, float)
  scale = max(float(np.ptp(y)), 1e-3 * float(np.max(np.abs(y))), 1e-12)
  if start is None:
    e0 = max(float(np.min(y)) - scale, 0.0)
    start = (e0, max(float(np.max(y)) - e0, 1e-9), 0.3)
  start = np.clip(np.asarray(start, float), [0.0, 0.0, 1e-3], [float(np.min(y)), np.inf, 3.0])
  residuals = lambda p: (p[0] + p[1] * x ** -p[2] - y) / scale
  jacobian = lambda p: np.stack([np.ones_like(x), x ** -p[2], -p[1] * x ** -p[2] * np.log(x)], axis=1) / scale
  e, a, alpha = _least_squares(residuals, jacobian, start, [0.0, 0.0, 1e-3], [float(np.min(y)), np.inf, 3.0])
  return float(e), float(a), float(alpha)


def compute_multiplier(law: tuple[float, float, float], c_min: float, loss: float, compute: float) -> float:
  """How many times `compute` the baseline's law needs to reach `loss`: > 1 where the method is worth more compute
  than it costs; inf where the law never reaches it (below its E)."""
  e, a, alpha = law
  if loss <= e or a <= 0:
    return float("inf")
  return float(c_min * ((loss - e) / a) ** (-1.0 / alpha) / compute)


def stretch(dof: int) -> float:
  """t(dof) / z at LEVEL: how much wider an interval must be when the noise it rests on was estimated from `dof`
  degrees of freedom (1 for no estimate)."""
  if dof < 1:
    return 1.0
  q = 1 - (1 - LEVEL) / 2
  return float(stats.t.ppf(q, dof) / stats.norm.ppf(q))


def bootstrap(
  cells: Sequence[Sequence[float]],
  statistic: Callable[[list[np.ndarray]], np.ndarray],
  noise: float,
  resamples: int = 500,
  seed: int = 0,
) -> np.ndarray:
  """`statistic` of `resamples` parametric draws of `cells`, one row per draw: each cell becomes its mean moved by a
  normal draw of `noise` (the seeds' relative noise pooled over every cell: relative_noise) over √n; draws where
  the fit failed (NaN) are dropped. (Resampling each cell's own 3 seeds read the noise from 2 degrees of freedom a
  cell: 90% intervals covered the truth in 78–87% of simulated studies.)"""
  rng = np.random.default_rng(seed)
  means, counts = [float(np.mean(c)) for c in cells], [len(c) for c in cells]
  out = []
  for _ in range(resamples):
    drawn = [np.array([m * (1 + noise / np.sqrt(n) * rng.standard_normal())]) for m, n in zip(means, counts)]
    try:
      value = np.asarray(statistic(drawn), float)
    except (ValueError, FloatingPointError, np.linalg.LinAlgError):
      continue
    if not np.any(np.isnan(value)):
      out.append(value)
  return np.asarray(out)


def interval(value: float, samples: np.ndarray, dof: int = 0) -> Interval:
  """`value` with the central LEVEL percentile interval of its bootstrap `samples`, stretched about `value` by
  t(dof)/z for a noise estimated from `dof` degrees of freedom (a t interval where the fit is linear)."""
  if samples.size == 0:
    return Interval(value, float("nan"), float("nan"))
  tail = 100 * (1 - LEVEL) / 2
  low, high = np.percentile(samples, [tail, 100 - tail], method="nearest")  # an order statistic: inf stays inf
  if not np.isfinite(value):
    return Interval(value, float(low), float(high))
  k = stretch(dof)
  return Interval(value, float(value - k * (value - low)), float(value + k * (high - value)))


@dataclasses.dataclass
class GapFit:
  """ΔL(N) = a·(N/N₀)^(−b) of one method against one reference, with intervals and residuals."""

  params: list[float]  # N per size
  gaps: list[float]  # relative gap per size (method mean / reference mean − 1)
  errors: list[float]  # the standard error of each gap, from its own seeds (delta method, gap_error)
  a: Interval
  b: Interval
  residuals: list[float]
  draws: np.ndarray = dataclasses.field(repr=False, default_factory=lambda: np.zeros((0, 2)))  # bootstrap (a, b)
  pooled_errors: list[float] = dataclasses.field(default_factory=list)  # each gap's, from the pooled relative noise
  noise_dof: int = 0  # the pooled noise's degrees of freedom

  def curve(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fitted gap at parameters `n`, and the LEVEL band of the bootstrap's curves there."""
    x = np.asarray(n, float) / min(self.params)
    fitted = self.a.value * x**-self.b.value
    if not len(self.draws):
      return fitted, fitted, fitted
    curves = self.draws[:, :1] * x[None, :] ** -self.draws[:, 1:]
    tail, k = 100 * (1 - LEVEL) / 2, stretch(self.noise_dof)
    low, high = np.percentile(curves, tail, axis=0), np.percentile(curves, 100 - tail, axis=0)
    return fitted, fitted - k * (fitted - low), fitted + k * (high - fitted)

  def lack_of_fit(self) -> float:
    """The probability of residuals this large or larger were the law true and the seeds' noise the only error:
    the sum of the squared residuals in pooled standard errors over sizes − 2, against F(sizes − 2, the noise's
    degrees of freedom); 1 where no degree of freedom is left. (Each gap's own 3 + 3 seeds as its error made the
    statistic heavy-tailed: 26–30% false alarms at the 10% level under the true law.)"""
    dof = len(self.params) - 2
    if dof < 1 or self.noise_dof < 1 or not all(e > 0 for e in self.pooled_errors):
      return 1.0
    f = float(np.sum((np.asarray(self.residuals) / np.asarray(self.pooled_errors)) ** 2)) / dof
    return float(stats.f.sf(f, dof, self.noise_dof))

  def reading(self) -> str:
    """What the data can and cannot say about the trend, in words."""
    if len(self.params) < 3:
      return (
        f"{len(self.params)} sizes: a two-parameter law goes through them exactly; no trend can be read "
        f"(at least 3 sizes, better 4 or more)"
      )
    if (p := self.lack_of_fit()) < 1 - LEVEL:
      in_errors = np.asarray(self.residuals) / np.asarray(self.pooled_errors)
      worst = int(np.argmax(np.abs(in_errors)))
      return (
        f"the law does not fit (p = {p:.2g} that the seeds' noise alone leaves residuals this large; the "
        f"worst, at {self.params[worst]:.3g} parameters, is {in_errors[worst]:+.1f} standard errors): no trend "
        f"can be read from it"
      )
    if self.b.spans(0.0):
      return (
        f"the exponent's interval {self.b.text()} spans 0: the data do not show the gap shrinking or growing with size"
      )
    way = "shrinks" if (self.b.value > 0) else "grows"
    return f"the gap {way} with size: b = {self.b.text()} ({LEVEL:.0%} interval)"


def gap_error(method: Sequence[float], reference: Sequence[float]) -> float:
  """The standard error of the gap R − 1, R = method mean / reference mean, by the delta method:
  √(s_m²/n_m + R²·s_r²/n_r) / reference mean (the reference's noise scaled by the ratio, so it holds far from a
  zero gap: without R², 1.5× too large at −47%, 26% too small at +200%); 0 for one seed."""
  m, r = np.asarray(method, float), np.asarray(reference, float)
  if len(m) < 2 or len(r) < 2:
    return 0.0
  ratio = m.mean() / r.mean()
  return float(np.sqrt(m.var(ddof=1) / len(m) + ratio**2 * r.var(ddof=1) / len(r)) / r.mean())


def relative_noise(cells: Sequence[Sequence[float]]) -> tuple[float, int]:
  """The seeds' standard deviation relative to their cell's mean, pooled over `cells` (each cell's values over its
  mean, their squared deviations summed and divided by Σ(n − 1)), and its degrees of freedom Σ(n − 1); (0, 0)
  where no cell has two seeds. Every cell of a study shares one relative noise; pooling it over all of them is
  what makes the lack-of-fit statistic's reference distribution F, not a χ² over 2-degree-of-freedom estimates."""
  arrays = [np.asarray(c, float) for c in cells if len(c) > 1]
  dof = sum(len(a) - 1 for a in arrays)
  if not dof:
    return 0.0, 0
  return float(np.sqrt(sum(float(np.sum((a / a.mean() - 1.0) ** 2)) for a in arrays) / dof)), dof


def pooled_std(cells: Sequence[Sequence[float]]) -> float:
  """The seeds' standard deviation pooled over `cells` (Σ of squared deviations over Σ(n − 1); cells of one seed
  count for nothing); 0 where no cell has two seeds."""
  arrays = [np.asarray(c, float) for c in cells if len(c) > 1]
  dof = sum(len(a) - 1 for a in arrays)
  return float(np.sqrt(sum(float(np.sum((a - a.mean()) ** 2)) for a in arrays) / dof)) if dof else 0.0


def gap_fit(
  params: Sequence[float],
  method: Sequence[Sequence[float]],
  reference: Sequence[Sequence[float]],
  resamples: int = 500,
  seed: int = 0,
) -> GapFit:
  """The relative gap of `method`'s losses to `reference`'s per size (each a list of seeds' losses), fitted against
  `params`, with bootstrap intervals over the seeds of both."""
  n = np.asarray(params, float)
  k = len(method)

  def gaps(cells: list[np.ndarray]) -> np.ndarray:
    return np.asarray([cells[i].mean() / cells[k + i].mean() - 1.0 for i in range(k)])

  observed = gaps([np.asarray(c, float) for c in (*method, *reference)])
  a, b = fit_gap(n, observed)
  noise, dof = relative_noise([*method, *reference])
  samples = bootstrap(
    [*method, *reference], lambda cells: np.asarray(fit_gap(n, gaps(cells), (a, b))), noise, resamples, seed
  )
  residuals = observed - a * (n / n.min()) ** -b
  pooled = [(1.0 + g) * noise * np.sqrt(1 / len(m) + 1 / len(r)) for g, m, r in zip(observed, method, reference)]
  return GapFit(
    n.tolist(),
    observed.tolist(),
    [gap_error(m, r) for m, r in zip(method, reference, strict=True)],
    interval(a, samples[:, 0] if samples.size else samples, dof),
    interval(b, samples[:, 1] if samples.size else samples, dof),
    residuals.tolist(),
    samples.reshape(-1, 2),
    [float(e) for e in pooled],
    dof,
  )


@dataclasses.dataclass
class ComputeFit:
  """L(C) = E + A·(C/C₀)^(−α) of one method, with intervals and residuals."""

  compute: list[float]  # training FLOPs per size
  losses: list[float]  # mean loss per size
  e: Interval
  a: Interval
  alpha: Interval
  residuals: list[float]
  draws: np.ndarray = dataclasses.field(repr=False, default_factory=lambda: np.zeros((0, 3)))  # bootstrap (E, A, α)
  noise_dof: int = 0  # the degrees of freedom of the pooled seed noise the intervals rest on

  def curve(self, c: np.ndarray) -> np.ndarray:
    """The fitted loss at compute `c`."""
    e, a, alpha = self.law
    return e + a * (np.asarray(c, float) / min(self.compute)) ** -alpha

  def predict(self, c: float, noise: float = 0.0, seed: int = 0) -> Interval:
    """The loss at compute `c` with its LEVEL interval: every bootstrap law's value there, plus a normal draw of
    standard deviation `noise` (the seed noise of the mean to be measured)."""
    x = c / min(self.compute)
    values = self.draws[:, 0] + self.draws[:, 1] * x ** -self.draws[:, 2]
    values = values + noise * np.random.default_rng(seed).standard_normal(len(values))
    return interval(float(self.curve(c)), values, self.noise_dof)

  @property
  def law(self) -> tuple[float, float, float]:
    """(E, A, α) at their fitted values."""
    return self.e.value, self.a.value, self.alpha.value


def compute_fit(
  compute: Sequence[float], losses: Sequence[Sequence[float]], resamples: int = 500, seed: int = 0
) -> ComputeFit:
  """`losses` (seeds per size) against `compute`, with bootstrap intervals over the seeds."""
  c = np.asarray(compute, float)
  means = lambda cells: np.asarray([np.mean(x) for x in cells])
  observed = means(losses)
  law = fit_loss_compute(c, observed)
  noise, dof = relative_noise(losses)
  samples = bootstrap(losses, lambda cells: np.asarray(fit_loss_compute(c, means(cells), law)), noise, resamples, seed)
  residuals = observed - (law[0] + law[1] * (c / c.min()) ** -law[2])
  pick = lambda i: samples[:, i] if samples.size else samples
  return ComputeFit(
    c.tolist(),
    observed.tolist(),
    interval(law[0], pick(0), dof),
    interval(law[1], pick(1), dof),
    interval(law[2], pick(2), dof),
    residuals.tolist(),
    samples.reshape(-1, 3),
    dof,
  )


def multiplier(
  baseline: Sequence[Sequence[float]],
  method: Sequence[Sequence[float]],
  compute: Sequence[float],
  resamples: int = 500,
  seed: int = 0,
) -> list[Interval]:
  """Per size, the compute multiplier of `method` against the baseline's law L(C) (both seeds per size, trained
  with the same `compute`): the baseline and the method resampled together."""
  c = np.asarray(compute, float)
  k = len(baseline)
  arrays = [np.asarray(x, float) for x in (*baseline, *method)]
  law = fit_loss_compute(c, np.asarray([x.mean() for x in arrays[:k]]))

  def statistic(cells: list[np.ndarray]) -> np.ndarray:  # each resample's law, started from the observed one
    fitted = fit_loss_compute(c, np.asarray([x.mean() for x in cells[:k]]), law)
    return np.asarray([compute_multiplier(fitted, c.min(), cells[k + i].mean(), c[i]) for i in range(k)])

  observed = [compute_multiplier(law, c.min(), arrays[k + i].mean(), c[i]) for i in range(k)]
  noise, dof = relative_noise(arrays)
  samples = bootstrap(arrays, statistic, noise, resamples, seed)
  return [interval(float(observed[i]), samples[:, i] if samples.size else samples, dof) for i in range(k)]
