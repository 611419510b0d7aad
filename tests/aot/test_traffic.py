"""The independent count of a train step's device-memory traffic, term by term against the closed form written
out from the model's shapes (a plain llama: four D×D attention matrices, three D×F MLP matrices, the tied
embedding, two gains a block and a final one)."""

import json

import pytest

from locations import ROOT
from tapernorm_jax.aot import report, traffic

V, D, L, F, T = 512, 64, 3, 160, 32


def llama(**fields):
  return dict(V=V, D=D, H=4, L=L, F=F, T=T, internal_norm="plain", final_norm="plain", dtype="auto", **fields)


def closed_form(batch: int, microbatches: int, fsdp: int, chips: int, recompute: bool) -> dict[str, float]:
  matrices = V * D + L * (4 * D * D + 3 * D * F)
  params = matrices + L * 2 * D + D
  tokens = batch * T / chips
  bf16 = 2  # dtype=auto on a TPU target
  return dict(
    optimizer=params / fsdp * (7 * 4 + 4 + 8 * (microbatches - 1)),
    weights=microbatches * matrices * ((6 if recompute else 4) * bf16 + 8),
    activations=tokens * L * (10 * D + 3 * F) * bf16 * (7 if recompute else 5),
    logits=tokens * V * (3 * 4 + 3 * bf16),
  )


@pytest.mark.parametrize(
  "batch,microbatches,fsdp,chips,remat",
  [(8, 1, 4, 4, "none"), (16, 2, 2, 8, "save_matmuls"), (32, 4, 8, 8, "full")],
)
def test_each_term_is_the_closed_form(batch, microbatches, fsdp, chips, remat):
  count = traffic.train_step_traffic(llama(remat=remat), batch, microbatches, fsdp, chips)
  expected = closed_form(batch, microbatches, fsdp, chips, recompute=remat == "full")
  assert {t: getattr(count, t) for t in expected} == pytest.approx(expected)
  assert count.total == pytest.approx(sum(expected.values()))


def test_a_compile_checks_results_give_the_same_count():
  results = {"run": {"model": llama(), "batch_size": 8, "microbatches": 1}, "mesh": {"fsdp": 4}, "chips": 4}
  assert traffic.for_results(results) == traffic.train_step_traffic(llama(), 8, 1, 4, 4)


def test_the_committed_compile_reports_are_what_their_results_render_to():
  """Each docs/tpu_results report, traffic section included, is `report.markdown` of its results.json: a report
  format change is re-rendered (`compile_check --render=DIR`), not left stale."""
  found = sorted((ROOT / "docs" / "tpu_results").rglob("results.json"))
  assert found
  for path in found:
    results = json.loads(path.read_text())
    assert (path.parent / "report.md").read_text() == report.markdown(results, results["command"]) + "\n", path


def test_render_names_a_directory_without_results(tmp_path):
  with pytest.raises(ValueError, match=rf"--render={tmp_path}: cannot read .*results.json"):
    report.render(str(tmp_path))
