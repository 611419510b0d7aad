"""The train mode of the peer benchmark without PyTorch (tapernorm_jax/benchmarks/peer_train.py): cells, the
first-loss check, a whole cell against a stand-in peer, and the table's round-by-round ratios."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tapernorm_jax.benchmarks import peer, peer_train
from tapernorm_jax.model import Transformer
from tapernorm_jax.model.norms import CALIB
from tapernorm_jax.train import run_config


@pytest.mark.parametrize("cell", ["9m", "9m:4", "10m:4x512", "9m:0x512", "9m:4x1"])
def test_a_cell_that_does_not_parse_is_refused_by_name(cell):
  with pytest.raises(ValueError, match=f"train_cells: '{cell}' is not SIZE:BATCHxT"):
    peer.Settings(size="cpu", dtype="float32", train_cells=(cell,))
  assert peer_train.parse_cell("30m:1x512") == ("30m", 1, 512)


def test_the_first_losses_must_agree():
  assert peer_train.check_loss(9.2103, 9.2104)["relative_difference"] == pytest.approx(1e-4 / 9.2103, rel=1e-3)
  with pytest.raises(peer_train.LossMismatchError, match=r"9\.300000 differs from this project's 9\.210300"):
    peer_train.check_loss(9.2103, 9.3)


class StandInPeer:
  """A peer whose loss is the model's cross-entropy computed outside the train step (a second code path)."""

  def __init__(self, trainer, seed: int, offset: float = 0.0):
    state = trainer.init_state(seed)
    self.variables = {"params": state["params"], CALIB: state["calib"]}
    self.cfg, self.offset, self.calls = trainer.model_cfg, offset, 0

  def first_loss(self, batch_BxT1):
    logits_BxTxV = Transformer(self.cfg).apply(self.variables, jnp.asarray(batch_BxT1[:, :-1]), jnp.float32(1.0))
    ce = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, jnp.asarray(batch_BxT1[:, 1:]))
    return float(jnp.mean(ce)) + self.offset

  def train_calls(self, batch_BxT1):
    def step():
      self.calls += 1
      return jnp.sum(jnp.asarray(batch_BxT1))

    return {"hf_eager": step, "hf_compiled": "InductorError: no C++ compiler"}


def settings(**changes):
  return peer.Settings(size="cpu", dtype="float32", repeats=2, warmup=0, min_sample_s=0.0, **changes)


def test_a_cell_checks_the_loss_then_times_every_contender_round_robin():
  made = []
  make = lambda trainer: made.append(StandInPeer(trainer, seed=0)) or made[-1]
  row = peer_train.bench_cell("cpu:8x16", make, settings())
  c = row["contenders"]
  assert row["loss"]["relative_difference"] < 1e-5
  assert c["hf_compiled"] == {"na": "InductorError: no C++ compiler"}
  assert all(len(c[name]["seconds"]) == 2 for name in ("hf_eager", "baseline", "taper"))
  assert made[0].calls >= 3  # compile + warm-up + 2 rounds
  assert set(row["ratios"]) == {"baseline/hf_eager", "taper/hf_eager", "taper/baseline"}
  model = run_config.get_config("baseline", "size=cpu").model
  n, L, D = row["params"], model.L, model.D
  assert row["flops_per_token"] == 6 * n + 12 * L * D * 16
  peak = row["peak"]["flops"]
  assert c["baseline"]["mfu"] == pytest.approx(c["baseline"]["median"] * row["flops_per_token"] / peak)
  table = peer_train.markdown([row], repeats=2, min_sample_s=0.0)
  assert "| cpu | 8 × 16 |" in table and "n/a" in table and "measured float32 GEMM rate" in table


def test_a_peer_whose_loss_differs_is_never_timed():
  make = lambda trainer: StandInPeer(trainer, seed=0, offset=0.01)
  with pytest.raises(peer_train.LossMismatchError, match="no timing is reported"):
    peer_train.bench_cell("cpu:8x16", make, settings())


def test_the_table_takes_ratios_round_by_round():
  drift = (1.0, 1.6, 0.9)  # the machine's speed per round, shared by every contender: cancels from each ratio
  rate = lambda median: {"median": median, "seconds": [1 / (median * f) for f in drift], "mfu": 0.25}
  contenders = {"hf_eager": rate(1000.0), "hf_compiled": rate(1500.0), "baseline": rate(1800.0),
                "taper": rate(1764.0)}
  ratios = {key: peer.paired_ratio(contenders[key.split("/")[0]]["seconds"], contenders[key.split("/")[1]]["seconds"])
            for key in ("baseline/hf_eager", "baseline/hf_compiled", "taper/baseline")}
  row = {"size": "9m", "B": 4, "T": 512, "contenders": contenders, "ratios": ratios, "loss": {"relative_difference": 0},
         "peak": {"flops": 1e11, "source": "a test peak"}}
  table = peer_train.markdown([row], repeats=3, min_sample_s=3.0)
  assert ("| 9m | 4 × 512 | 1,000 | 1,500 | 1,800 | 1,764 | 1.80× (1.80–1.80) | 1.20× (1.20–1.20) | "
          "0.98× (0.98–0.98) | 25.0% |") in table


def test_the_cpu_peak_is_a_measured_gemm_rate():
  p = peer_train.hardware.peak()
  assert jax.default_backend() == "cpu" and "measured float32 GEMM rate" in p["source"]
  assert 1e9 < p["flops"] / jax.process_count() < 1e14 and np.isfinite(p["flops"])
