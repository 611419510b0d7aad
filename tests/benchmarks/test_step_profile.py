"""Where a train step's time goes (`benchmarks/step_profile.py`): op names sorted into parts, the busy time of
overlapping ops, and a traced step of the cpu preset whose parts add up."""

import mmap

import pytest

from tapernorm_jax.benchmarks import step_profile

BLOCK = "jit(<lambda>)/transpose(jvp(Transformer))/Transformer.hidden/Transformer.block/block_3"


@pytest.mark.parametrize(
  "name,op,expected",
  [
    ("copy_bitcast_fusion.3", f"{BLOCK}/mlp/jit(silu)", "layout copies"),
    ("ynn_fusion.7", f"{BLOCK}/attn/bld,blthk->dthk/dot_general", "attention projections (qkv, out)"),
    ("ynn_fusion.8", f"{BLOCK}/attn/attn.project_out/bthk,hkd->btd/dot_general", "attention projections (qkv, out)"),
    ("dot.3", f"{BLOCK}/attn/matrix_product/dot_general", "attention projections (qkv, out)"),
    ("custom-call.2", f"{BLOCK}/attn/ffi_call", "attention (scores, softmax, values)"),
    ("fusion.4", f"{BLOCK}/attn/sin", "attention (scores, softmax, values)"),
    ("ynn_fusion.9", f"{BLOCK}/mlp/btd,df->btf/dot_general", "MLP products"),
    ("fusion.5", f"{BLOCK}/mlp/mul", "MLP activations"),
    ("fusion.6", f"{BLOCK}/attn_norm/rsqrt", "norms"),
    (
      "ynn_fusion.1",
      "jit(<lambda>)/jvp(Transformer)/Transformer.logits/bld,vd->blv/dot_general",
      "logits (head / tied embedding)",
    ),
    ("fusion.7", "jit(<lambda>)/jvp()/exp", "loss (softmax cross-entropy)"),
    ("fusion.8", "jit(<lambda>)/div", "optimiser, clipping, metrics"),
  ],
)
def test_ops_are_sorted_into_the_parts_of_a_step(name, op, expected):
  assert step_profile.part(name, op) == expected


def test_busy_time_counts_overlapping_ops_once():
  assert step_profile._busy_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17


def test_warm_up_stops_once_three_calls_in_a_row_make_no_page_faults():
  regions = []

  def touch_fresh_pages(calls_that_fault: int) -> None:  # 64 fresh pages on each of the first calls, then none
    if len(regions) < calls_that_fault:
      regions.append(mmap.mmap(-1, 64 * mmap.PAGESIZE))
      regions[-1][:: mmap.PAGESIZE] = b"x" * 64

  assert step_profile.warm_up(lambda: touch_fresh_pages(3), max_calls=10) == 6  # three that fault, three quiet
  regions.clear()
  assert step_profile.warm_up(lambda: touch_fresh_pages(100), max_calls=5) == 5  # never steady: stops at the cap


def test_a_traced_step_adds_up():
  profile = step_profile.profile_cell("cpu:8x32", steps=2)
  parts = profile["parts"]
  assert sum(parts.values()) == pytest.approx(profile["ops_ms"])
  assert any(key.startswith("MLP products | backward") for key in parts)
  assert any(key.startswith("attention (scores, softmax, values)") for key in parts)
  assert any(key.startswith("attention projections (qkv, out) | backward") for key in parts)  # not in attention
  assert 0 <= profile["idle_ms"] <= profile["wall_ms"]
  assert 1 <= profile["warmup_steps"] <= 12 and profile["faults_per_step"] >= 0
  table = step_profile.markdown({"cpu:8x32": profile})
  assert "| MLP products |" in table and "| **step wall time** |" in table and "| page faults per step" in table
