"""Reading optimised HLO (`aot/hlo.py`): products' FLOPs against closed forms and against XLA running the same
convolution, loop trip counts, multi-line instructions, replica groups in XLA's three spellings, and collectives
over a mesh that spans two (pretend) slices."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from tapernorm_jax.aot import hlo


def compiled(fn, *args):
  """The optimised module of `fn` compiled for these (abstract) arguments, with XLA's cost analysis."""
  c = jax.jit(fn).lower(*args).compile()
  cost = c.cost_analysis()
  return hlo.parse(c.as_text()), (cost[0] if isinstance(cost, list) else cost)


def test_a_matrix_product_counts_two_flops_per_multiply_add_like_xla():
  module, cost = compiled(
    lambda x, w: x @ w, jax.ShapeDtypeStruct((24, 40), jnp.float32), jax.ShapeDtypeStruct((40, 56), jnp.float32)
  )
  counts = hlo.Counts.of(module)
  assert hlo.product_flops(module, counts.runs) == 2 * 24 * 40 * 56 == cost["flops"]
  assert hlo.hbm_bytes(module, counts, counts.runs) == 4 * (24 * 40 + 40 * 56 + 24 * 56) == cost["bytes accessed"]


@pytest.mark.parametrize("trips", [1, 3, 8])
def test_a_scanned_product_counts_once_per_trip_where_xla_counts_it_once(trips):
  def scanned(x, w):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=trips)[0]

  module, cost = compiled(
    scanned, jax.ShapeDtypeStruct((16, 32), jnp.float32), jax.ShapeDtypeStruct((32, 32), jnp.float32)
  )
  counts = hlo.Counts.of(module)
  one = 2 * 16 * 32 * 32
  assert counts.unknown_loops == 0
  assert hlo.product_flops(module, counts.runs) == trips * one
  assert cost["flops"] < 2 * one  # XLA's own count sees the body once
  assert hlo.product_flops(module, counts.repeats()) == (trips - 1) * one  # what the compile check adds to it


@pytest.mark.parametrize(
  "window,stride,padding,lhs_dilation,rhs_dilation",
  [
    ((3, 4), (1, 1), ((2, 2), (3, 3)), (1, 1), (1, 1)),  # how the TPU compiler writes a product: taps on padding
    ((16, 1), (15, 1), ((0, 0), (0, 0)), (16, 1), (1, 1)),  # a batched product: one tap per output on a dilated axis
    ((3, 2), (2, 1), ((1, 0), (0, 1)), (1, 2), (2, 1)),
  ],
)
def test_convolution_flops_count_only_taps_that_land_on_input(window, stride, padding, lhs_dilation, rhs_dilation):
  """Against XLA itself: convolving all-ones gives, at each output, the number of taps on real input times the
  input features, so twice the output's sum is the multiply-adds that count."""
  B, H, W, I, O = 2, 5, 16, 3, 4
  lhs, rhs = jnp.ones((B, H, W, I)), jnp.ones(window + (I, O))
  out = jax.lax.conv_general_dilated(
    lhs, rhs, stride, padding, lhs_dilation, rhs_dilation, dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  hlo_window = (
    f"size={window[0]}x{window[1]} stride={stride[0]}x{stride[1]} "
    f"pad={padding[0][0]}_{padding[0][1]}x{padding[1][0]}_{padding[1][1]} "
    f"lhs_dilate={lhs_dilation[0]}x{lhs_dilation[1]} rhs_dilate={rhs_dilation[0]}x{rhs_dilation[1]}"
  )
  want = 2 * float(jnp.sum(out))
  attributes = f"window={{{hlo_window}}}, dim_labels=b01f_01io->b01f"
  assert hlo._convolution_flops(list(lhs.shape), list(rhs.shape), list(out.shape), attributes) == want
  # the same convolution with the input's spatial axes stored the other way round: the window still lists 0, 1
  swapped = f"window={{{hlo_window}}}, dim_labels=b10f_01io->b01f"
  assert hlo._convolution_flops([B, W, H, I], list(rhs.shape), list(out.shape), swapped) == want


def test_an_instruction_over_several_lines_stays_in_its_computation():
  text = """HloModule m

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %x = f32[4] get-tuple-element(%p), index=1
  %k = f32[4] custom-call(%x), custom_call_target="tpu_custom_call", backend_config={"meta":"{\\"a\\": 1,
}"}
  %y = f32[4,4] dot(%k, %x), lhs_contracting_dims={}, rhs_contracting_dims={}
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[4]) tuple(%i, %x)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]) tuple(%zero, %a)
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[4] get-tuple-element(%w), index=1
}
"""
  module = hlo.parse(text)
  assert [i.opcode for i in module.computations["body"]] == [
    "parameter",
    "get-tuple-element",
    "custom-call",
    "dot",
    "get-tuple-element",
    "tuple",
  ]
  counts = hlo.Counts.of(module)
  assert counts.runs["body"] == 5 and counts.runs["cond"] == 6 and counts.unknown_loops == 0
  assert hlo.product_flops(module, counts.runs) == 5 * 2 * 16
  assert hlo.custom_calls(module, counts) == {"k": 5.0}


@pytest.mark.parametrize("start,step,bound,trips", [(0, 1, 5, 5), (0, 2, 8, 4), (3, 2, 8, 3), (0, 3, 8, 3)])
def test_a_loop_counter_read_with_its_start_and_step(start, step, bound, trips):
  """XLA's windowed matrix products count i = 0, 2, 4, … < N: the trips are the counter's, not N."""
  text = f"""HloModule m

%cond (p: (s32[], f32[4])) -> pred[] {{
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant({bound})
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {{
  %p = (s32[], f32[4]) parameter(0)
  %x = f32[4] get-tuple-element(%p), index=1
  %i = s32[] get-tuple-element(%p), index=0
  %c = s32[] constant({step})
  %next = s32[] add(%i, %c)
  %y = f32[4,4] dot(%x, %x), lhs_contracting_dims={{}}, rhs_contracting_dims={{}}
  ROOT %t = (s32[], f32[4]) tuple(%next, %x)
}}

ENTRY %main (a: f32[4]) -> f32[4] {{
  %a = f32[4] parameter(0)
  %zero = s32[] constant({start})
  %first = s32[] copy(%zero)
  %init = (s32[], f32[4]) tuple(%first, %a)
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[4] get-tuple-element(%w), index=1
}}
"""
  assert hlo.Counts.of(hlo.parse(text)).runs["body"] == trips


@pytest.mark.parametrize(
  "attributes,groups",
  [
    ("replica_groups={{0,2},{1,3}}, dimensions={0}", [[0, 2], [1, 3]]),
    ("replica_groups=[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[4,2]<=[2,4]T(1,0)", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['a'=2,'b'=4] {'a'}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['a'=2,'b'=4] {'b'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("source_target_pairs={{0,1},{1,0}}", [[0, 1], [1, 0]]),
    ("replica_groups={}", [list(range(8))]),
  ],
)
def test_replica_groups_in_every_spelling(attributes, groups):
  assert hlo.replica_groups(attributes, 8) == groups


def test_a_reduction_across_slices_is_counted_as_crossing_them():
  """A psum over the mesh axis whose devices sit in different (pretend) slices crosses them; one within a slice
  does not. Each device sends 2(n−1)/n of its bytes in a ring all-reduce."""
  devices = np.asarray(jax.devices()[:8]).reshape(2, 4)
  mesh = Mesh(devices, ("across", "within"))
  slices = [0] * 4 + [1] * 4  # the mesh's first axis runs across slices

  def total(axis):
    return jax.shard_map(
      functools.partial(jax.lax.psum, axis_name=axis),
      mesh=mesh,
      in_specs=P("across", "within"),
      out_specs=P("across", "within"),
    )

  x = jax.ShapeDtypeStruct((2 * 64, 4 * 32), jnp.float32)
  for axis, n, crosses in (("across", 2, True), ("within", 4, False)):
    module, _ = compiled(total(axis), x)
    found = [c for c in hlo.collectives(module, hlo.Counts.of(module), slices) if c.kind == "all-reduce"]
    assert [(c.group, c.crosses_slices) for c in found] == [(n, crosses)]
    assert found[0].bytes_sent == pytest.approx(2 * (n - 1) / n * 64 * 32 * 4)


SCANNED = """HloModule m

%read_row (p0: f32[8,256], p1: s32[]) -> f32[256] {
  %p0 = f32[8,256]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %row = f32[1,256]{1,0} dynamic-slice(%p0, %p1, %zero), dynamic_slice_sizes={1,256}
  %flat = f32[256]{0} bitcast(%row)
  ROOT %e = f32[256]{0} exponential(%flat)
}

%write_row (p0: f32[8,256], p1: s32[], p2: f32[256]) -> f32[8,256] {
  %p0 = f32[8,256]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %p2 = f32[256]{0} parameter(2)
  %zero = s32[] constant(0)
  %t = f32[256]{0} tanh(%p2)
  %u = f32[1,256]{1,0} bitcast(%t)
  ROOT %dus = f32[8,256]{1,0} dynamic-update-slice(%p0, %u, %p1, %zero)
}

%row_and_total (p0: f32[8,256], p1: s32[]) -> (f32[1,256], f32[]) {
  %p0 = f32[8,256]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %row = f32[1,256]{1,0} dynamic-slice(%p0, %p1, %zero), dynamic_slice_sizes={1,256}
  %fzero = f32[] constant(0)
  %total = f32[] reduce(%p0, %fzero), dimensions={0,1}, to_apply=%add
  ROOT %t = (f32[1,256]{1,0}, f32[]) tuple(%row, %total)
}

%nested_row (p0: f32[8,256], p1: s32[]) -> f32[256] {
  %p0 = f32[8,256]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  ROOT %r = f32[256]{0} fusion(%p0, %p1), kind=kLoop, calls=%read_row
}

%as_flat (p0: f32[8,256]) -> f32[2048] {
  %p0 = f32[8,256]{1,0} parameter(0)
  ROOT %flat = f32[2048]{0} bitcast(%p0)
}

%flat_exp (p0: f32[8,256]) -> f32[2048] {
  %p0 = f32[8,256]{1,0} parameter(0)
  %flat = f32[2048]{0} fusion(%p0), kind=kLoop, calls=%as_flat
  ROOT %e = f32[2048]{0} exponential(%flat)
}

%fresh_row (p0: f32[256], p1: s32[]) -> f32[8,256] {
  %p0 = f32[256]{0} parameter(0)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %fzero = f32[] constant(0)
  %blank = f32[8,256]{1,0} broadcast(%fzero), dimensions={}
  %u = f32[1,256]{1,0} bitcast(%p0)
  ROOT %dus = f32[8,256]{1,0} dynamic-update-slice(%blank, %u, %p1, %zero)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%cond (p: (s32[], f32[8,256], f32[8,256])) -> pred[] {
  %p = (s32[], f32[8,256], f32[8,256]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[8,256], f32[8,256])) -> (s32[], f32[8,256], f32[8,256]) {
  %p = (s32[], f32[8,256], f32[8,256]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %w = f32[8,256] get-tuple-element(%p), index=1
  %acts = f32[8,256] get-tuple-element(%p), index=2
  %row = f32[256]{0} fusion(%w, %i), kind=kLoop, calls=%read_row
  %written = f32[8,256]{1,0} fusion(%acts, %i, %row), kind=kLoop, calls=%write_row
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8,256], f32[8,256]) tuple(%next, %w, %written)
}

ENTRY %main (w: f32[8,256], acts: f32[8,256], i: s32[], x: f32[256]) -> (s32[], f32[8,256], f32[8,256]) {
  %w = f32[8,256]{1,0} parameter(0)
  %acts = f32[8,256]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %x = f32[256]{0} parameter(3)
  %both = (f32[1,256]{1,0}, f32[]) fusion(%w, %i), kind=kLoop, calls=%row_and_total
  %nested = f32[256]{0} fusion(%w, %i), kind=kLoop, calls=%nested_row
  %fresh = f32[8,256]{1,0} fusion(%x, %i), kind=kLoop, calls=%fresh_row
  %viewed = f32[2048]{0} fusion(%w), kind=kLoop, calls=%flat_exp
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,256], f32[8,256]) tuple(%zero, %w, %acts)
  ROOT %loop = (s32[], f32[8,256], f32[8,256]) while(%init), condition=%cond, body=%body
}
"""


def test_a_fusion_that_slices_or_updates_one_row_of_a_stack_moves_that_row():
  """A scanned loop's fusions read one layer's row of an (L, N) stack (a dynamic-slice inside the fusion) and write
  one row in place (a root dynamic-update-slice into a parameter): each trip moves a row, not the stack; a fusion
  that also reads the stack whole, updates a buffer it made itself, or reads it through a nested fusion that returns
  a view of it still counts it whole."""
  module = hlo.parse(SCANNED)
  row, stack, index = 256 * 4, 8 * 256 * 4, 4
  moved = {i.name: hlo._bytes_moved(module, c, i) for c in ("body", "main") for i in module.computations[c]}
  assert moved["row"] == row + index + row  # the slice read, the index, the result (was stack + index + row)
  assert moved["written"] == index + row + row  # the index and update read, the row written (was 2 stacks more)
  assert moved["nested"] == moved["row"]  # sliced inside a fusion inside the fusion
  assert moved["both"] == stack + index + row + 4  # the reduce reads it all
  assert moved["fresh"] == row + index + stack  # not in place: the whole new buffer is written
  assert moved["viewed"] == stack + stack  # a nested fusion that returns a view of the stack reads it all
  counts = hlo.Counts.of(module)
  assert counts.runs["body"] == 8
  body = hlo.hbm_bytes(module, counts, {"body": counts.runs["body"]})
  assert body == 8 * (moved["row"] + moved["written"] + 3 * index)  # and the counter's add
