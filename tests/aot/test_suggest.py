"""The candidates `--suggest` compiles: every split of one batch and every remat policy, in the order it tries them,
each selectable by the flags it prints."""

from tapernorm_jax.aot import suggest
from tapernorm_jax.model.config import REMAT_POLICIES
from tapernorm_jax.train import run_config


def test_candidates_are_every_split_and_remat_policy_fewest_microbatches_then_least_recomputation_first():
  cfg = run_config.get_config("all_taper", "size=cpu")
  cfg.train.batch_size = 32
  found = list(suggest.candidates(cfg, 4, 1))
  # fsdp divides the 4 chips; k microbatches leave each chip whole rows (32 % (4·k) == 0)
  expected = {(f, k, r) for f in (1, 2, 4) for k in (1, 2, 4, 8) for r in REMAT_POLICIES}
  assert len(found) == len(expected) and {(c.fsdp, c.microbatches, c.remat) for c in found} == expected
  order = [(c.microbatches, suggest.REMAT_ORDER.index(c.remat), -c.fsdp) for c in found]
  assert order == sorted(order) and found[0] == suggest.Candidate(4, 1, "none")


def test_a_candidate_s_flags_set_what_its_overrides_set():
  candidate = suggest.Candidate(2, 4, "save_matmuls")
  flags = dict(flag.removeprefix("--config.").split("=") for flag in candidate.flags().split())
  overrides = {k: str(v) for k, v in candidate.overrides().items() if k != "mesh.data"}  # data takes the rest
  assert flags == overrides
  cfg = run_config.override(run_config.get_config("all_taper", "size=cpu"), candidate.overrides())
  assert (cfg.mesh.fsdp, cfg.train.microbatches, cfg.model.remat) == (2, 4, "save_matmuls")
