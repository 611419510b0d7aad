"""Programs compiled by the real TPU compiler for a v5e:2x2 slice, on this CPU host (libtpu, nothing run): the TPU's
own choices (bf16 for `auto`, splash attention where the length tiles, no CPU custom call), each chip's share of
the state and of the FLOPs, a scanned train step, a mesh across two slices, and a config too big to fit named in one
line."""

import dataclasses
import re

import jax
import pytest

from tapernorm_jax.runtime import costs
from tapernorm_jax.aot import analysis, check, chips, hlo, programs, topology, traffic
from tapernorm_jax.model import ModelConfig, abstract_variables, init, param_count, sharding
from tapernorm_jax.taper import fold
from tapernorm_jax.train.trainer import Trainer
from aot_helpers import needs_libtpu, small_config, state_bytes_per_device

pytestmark = needs_libtpu
V5E = chips.chip("v5e:2x2")


def compile_for_v5e(cfg, decoding=None) -> tuple[Trainer, list[analysis.Figures], list[hlo.Module]]:
  """The trainer over a v5e:2x2 mesh, with the figures and modules of its train step (and its inference
  programs, given `decoding`)."""
  trainer = Trainer(cfg, sharding.make_mesh(-1, cfg.mesh.fsdp, list(topology.devices("v5e:2x2"))))
  wanted = programs.training(trainer)[:1] + (programs.inference(trainer, decoding) if decoding else [])
  figures, modules = [], []
  for program in wanted:
    compiled = program.lower().compile()
    modules.append(hlo.parse(compiled.as_text()))
    figures.append(analysis.compile_program(program, V5E, [0] * 4))
  return trainer, figures, modules


def bf16_share(module: hlo.Module) -> float:
  """The share of a module's product FLOPs whose operands are bf16."""
  flops = {True: 0.0, False: 0.0}
  for name, body in module.computations.items():
    for i in body:
      if i.opcode in ("dot", "convolution"):
        bf16 = all(module.shape_of(name, operand).startswith("bf16") for operand in i.operands)
        flops[bf16] += hlo._product_flops(module, name, i)
  return flops[True] / (flops[True] + flops[False])


@pytest.mark.parametrize("T,splash,scan", [(128, True, False), (96, False, False), (128, True, True)])
def test_the_train_step_for_a_tpu_mesh_is_the_tpu_program(T, splash, scan):
  cfg = small_config(
    4, 8, T=T, D=256, H=2, V=1024, L=2, scan_layers="scanned" if scan else "unrolled"
  )  # scanned: the kernels inside the loop
  trainer, (step,), (module,) = compile_for_v5e(cfg)
  assert trainer.model_cfg.platform == "tpu" and str(trainer.model_cfg.compute_dtype) == "bfloat16"
  assert bf16_share(module) > 0.9, bf16_share(module)  # dtype=auto on a TPU target, on a CPU host
  assert any("splash" in kernel for kernel in step.kernels) == splash  # its Mosaic call, not interpret mode
  assert not any(kernel.startswith("tapernorm_") for kernel in step.kernels)  # no CPU custom call
  loops = [
    hlo.trip_count(module, name, i) for name, body in module.computations.items() for i in body if i.opcode == "while"
  ]
  assert (cfg.model.L in loops) == scan  # one block body, run L times forward and L times backward
  params = programs.matmul_params(trainer.abstract_state()["params"], trainer.model_cfg)
  analytic = costs.train_flops_per_token(params, 2, 256, T) * 8 * T / 4
  assert step.flops == pytest.approx(analytic, rel=0.1)
  # each chip holds a quarter of the parameters and Adam moments; TPU tiles pad small arrays (gains, scalars)
  assert 1.0 <= step.memory["argument"] / state_bytes_per_device(cfg, 4, 4) < 1.15
  assert step.fits and step.estimate.step_s > 0
  floor = traffic.train_step_traffic(cfg.model, 8, cfg.train.microbatches, cfg.mesh.fsdp, 4).total
  assert floor <= step.hbm_bytes < 10 * floor, (step.hbm_bytes, floor)  # the compiler's count is above the floor


def test_scanned_and_unrolled_train_steps_move_about_the_same_bytes():
  """The scanned step's loop reads one layer's slice of each stacked buffer and writes one in place per trip, so its
  device-memory traffic stays near the unrolled step's. Measured (L = 8, jax 0.10.2, libtpu 0.0.42.1): 127 MB scanned
  against 150 MB unrolled; counting the loop's fusions' stacked operands and results whole gave 389 MB against 167 MB
  (2.3×)."""
  moved = {}
  for scan in (False, True):
    cfg = small_config(4, 8, L=8, scan_layers="scanned" if scan else "unrolled")
    trainer = Trainer(cfg, sharding.make_mesh(-1, cfg.mesh.fsdp, list(topology.devices("v5e:2x2"))))
    moved[scan] = analysis.compile_program(programs.training(trainer)[0], V5E, [0] * 4).hbm_bytes
  assert 1 / 1.5 < moved[True] / moved[False] < 1.5, moved


def test_decoding_for_a_tpu_mesh_keeps_bf16_and_no_cpu_kernel():
  cfg = small_config(4, 8, T=256, D=256, H=2, V=1024, L=2)
  trainer, figures, modules = compile_for_v5e(cfg, programs.Decoding(batch=4, prompt_len=128))
  by_name = {f.program: (f, m) for f, m in zip(figures, modules)}
  assert set(by_name) == {"train_step", "fold", "prefill", "decode_step", "serve_prefill", "serve_decode_step"}
  for name in ("prefill", "decode_step"):
    figures_, module = by_name[name]
    assert figures_.fits and not any(k.startswith("tapernorm_") for k in figures_.kernels)
    cache_keys = [
      i.shape
      for i in module.computations[module.entry]
      if i.opcode == "parameter" and re.match(r"\w+\[2,128,256\]", i.shape)
    ]  # each chip's 4·2/4 rows of K × 256 slots
    assert cache_keys and all(shape.startswith("bf16") for shape in cache_keys)
  assert bf16_share(by_name["prefill"][1]) > 0.9
  assert any("splash" in k for k in by_name["prefill"][0].kernels)  # 128-token prompts tile


def test_data_parallel_decoding_moves_nothing_between_chips():
  """Whole weights on every chip and each chip's own rows of prompt, cache and tokens: nothing to exchange (the
  cache's per-row writes once moved every row across chips, one collective per row and layer)."""
  cfg = small_config(1, 8, T=256, D=256, H=2, V=1024, L=2)
  trainer = Trainer(cfg, sharding.make_mesh(-1, 1, list(topology.devices("v5e:2x2"))))
  inference = programs.inference(trainer, programs.Decoding(batch=8, prompt_len=128))
  for program in (p for p in inference if p.name in ("prefill", "decode_step")):
    figures = analysis.compile_program(program, V5E, [0] * 4)
    assert figures.collectives == {}, (program.name, figures.collectives)


def test_the_serving_layout_decodes_from_whole_bf16_weights_and_moves_no_weights_between_chips():
  """With the weights split four ways (fsdp), the training-layout decode step gathers them every token; the serving
  step holds the folded weights whole in bfloat16 on each chip and moves under 5% of their bytes between chips."""
  cfg = small_config(4, 8, T=256, D=256, H=2, V=1024, L=2)
  trainer = Trainer(cfg, sharding.make_mesh(-1, 4, list(topology.devices("v5e:2x2"))))
  by_name = {p.name: p for p in programs.inference(trainer, programs.Decoding(batch=4, prompt_len=128))}
  model_cfg = fold.folded_config(trainer.model_cfg)
  weights = 2 * param_count(jax.eval_shape(lambda: init(model_cfg, jax.random.key(0)))["params"])  # bf16 bytes
  moved = {}
  for name in ("decode_step", "serve_decode_step"):
    figures = analysis.compile_program(by_name[name], V5E, [0] * 4)
    moved[name] = sum(t["ici_bytes"] for t in figures.collectives.values())
  assert moved["decode_step"] > 0.5 * weights and moved["serve_decode_step"] <= 0.05 * weights, (moved, weights)
  module = hlo.parse(by_name["serve_decode_step"].lower().compile().as_text())
  parameters = [i.shape for i in module.computations[module.entry] if i.opcode == "parameter"]
  assert sum(shape.startswith("bf16[256,3,2,128]") for shape in parameters) == 2, parameters  # each block's qkv, whole
  assert not any(shape.startswith("f32[") for shape in parameters), parameters


def test_a_mesh_over_two_slices_puts_the_data_axis_across_them():
  devices = list(topology.devices("v5e:2x2", slices=2))
  mesh = sharding.make_mesh(-1, 4, devices)
  assert [[d.slice_index for d in row] for row in mesh.devices] == [[0] * 4, [1] * 4]
  with pytest.raises(ValueError, match=r"mesh\.data=1: the 8 devices span 2 slices"):
    sharding.make_mesh(1, 8, devices)
  cfg = small_config(4, 16, T=128, D=256, H=2, V=1024, L=2)
  figures = analysis.compile_program(programs.run_programs(cfg, mesh, None)[0], V5E, check.slice_indices(mesh))
  dcn = sum(t["dcn_bytes"] for t in figures.collectives.values())
  assert dcn > 0 and figures.collectives["all-reduce"]["dcn_bytes"] > 0  # the gradients' sum crosses the slices


def test_a_run_that_does_not_fit_is_named_in_one_line():
  cfg = small_config(4, 2048, T=512, D=128, H=1, V=32768, L=1)  # 512 rows of 32,768 fp32 logits per chip
  results = check.check(cfg, check.Target("v5e:2x2"), None, progress=lambda _: None)
  assert [p["program"] for p in results["programs"]] == ["train_step"]  # stops at the first that does not fit
  line = check.verdict(results)
  assert re.fullmatch(
    r"train_step does not fit: it needs \d+\.\d\d GiB per chip, a v5e chip has 15\.75 GiB; .+", line
  ), line
  assert "\n" not in line


def test_without_libtpu_the_check_says_how_to_install_it(monkeypatch):
  monkeypatch.setattr(topology.importlib.util, "find_spec", lambda name: None)
  topology.devices.cache_clear()
  with pytest.raises(topology.MissingCompiler, match=r"not installed: pip install -e '\.\[tpu\]'"):
    topology.devices("v5e:2x2")


@pytest.mark.parametrize(
  "name,problem",
  [
    ("v9z:2x2", "unknown TPU generation 'v9z'"),
    ("v5e", "give GENERATION:SHAPE"),
    ("v5e:2xx2", "give GENERATION:SHAPE"),
  ],
)
def test_a_bad_topology_is_named(name, problem):
  with pytest.raises(ValueError, match=re.escape(problem)):
    topology.parse(name)


def test_jax_compiles_on_this_host_for_the_cpu_still():
  """Building TPU programs leaves this process's own backend alone."""
  assert sharding.platform_of(None) == "cpu" and jax.devices()[0].platform == "cpu"


def test_the_split_serving_layout_holds_a_share_of_each_block_and_moves_activations_only():
  """Split over the four chips (`Decoding.tensor`), each holds a quarter of every block's heads and MLP units in
  bfloat16, and a decode step moves the 2·L all-reduces of its rows' activations, a small fraction of the weights."""
  cfg = small_config(4, 8, T=256, D=256, H=4, V=1024, L=2)
  trainer = Trainer(cfg, sharding.make_mesh(-1, 4, list(topology.devices("v5e:2x2"))))
  by_name = {p.name: p for p in programs.inference(trainer, programs.Decoding(batch=4, prompt_len=128, tensor=4))}
  model_cfg = fold.folded_config(trainer.model_cfg)
  weights = 2 * param_count(jax.eval_shape(lambda: init(model_cfg, jax.random.key(0)))["params"])  # bf16 bytes
  figures = analysis.compile_program(by_name["serve_decode_step"], V5E, [0] * 4)
  assert set(figures.collectives) == {"all-reduce"}, figures.collectives
  assert 0 < figures.collectives["all-reduce"]["ici_bytes"] <= 0.05 * weights, (figures.collectives, weights)
  module = hlo.parse(by_name["serve_decode_step"].lower().compile().as_text())
  parameters = [i.shape for i in module.computations[module.entry] if i.opcode == "parameter"]
  assert sum(shape.startswith("bf16[256,3,1,64]") for shape in parameters) == 2, parameters  # a head of each qkv
  assert analysis.compile_program(by_name["serve_prefill"], V5E, [0] * 4).fits
  assert by_name["decode_step"].lower() is not None  # the training layout keeps its unpadded MLP (683 units)


def test_the_serving_split_is_chosen_from_the_chips_memory():
  """Whole on each chip while the bfloat16 weights take at most half its memory; else the fewest chips a copy that
  bring each share under that, over which heads and MLP units split."""
  model_cfg = ModelConfig.from_config(small_config(4, 8, T=256, D=256, H=4, V=1024, L=2).model)
  weights = 2 * param_count(abstract_variables(model_cfg))
  chip = lambda hbm: dataclasses.replace(V5E, hbm_bytes=hbm)
  assert check.serving_split(model_cfg, chip(2 * weights), 4) == 1
  assert check.serving_split(model_cfg, chip(1.9 * weights), 4) == 2
  assert check.serving_split(model_cfg, chip(0.6 * weights), 4) == 4
  assert check.serving_split(model_cfg, chip(0.1 * weights), 4) == 4  # the most that split
