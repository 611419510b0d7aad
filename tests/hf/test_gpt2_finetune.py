"""GPT-2 fine-tuning: the presets reproduce the paper's setup, a pretrained start reproduces the checkpoint's logits,
mismatches are named, and the CPU demo path runs end to end (pretrain → HF directory → fine-tune with each method)."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import base, gpt2
from tapernorm_jax.hf import gpt2 as hf_gpt2
from tapernorm_jax.hf import pretrained
from tapernorm_jax.model import ModelConfig, Transformer, sharding
from tapernorm_jax.taper import methods
from tapernorm_jax.taper.schedules import Phases
from tapernorm_jax.train.run_config import validate
from tapernorm_jax.taper.gpt2_variants import MODELS
from tapernorm_jax.train.trainer import Trainer
from locations import FIXTURES, ROOT, run_without_checkout

FIXTURE = FIXTURES / "tiny_gpt2"


@pytest.mark.parametrize(
  "size,D,H,L,steps,warmup,start,end,aux",
  [
    ("s", 768, 12, 12, 300, 25, 25, 100, 0.1),
    ("m", 1024, 16, 24, 500, 10, 20, 200, 0.1),
    ("l", 1280, 20, 36, 600, 30, 30, 500, 0.1),
    ("xl", 1600, 25, 48, 800, 20, 50, 700, 0.01),
  ],
)
@pytest.mark.parametrize("variant", list(gpt2.VARIANTS))
def test_presets_are_the_papers_setup(size, D, H, L, steps, warmup, start, end, aux, variant):
  cfg = gpt2.get_config(f"model={size},variant={variant}")
  model_cfg = ModelConfig.from_config(cfg.model)
  assert (model_cfg.V, model_cfg.T, model_cfg.D, model_cfg.H, model_cfg.L) == (50257, 1024, D, H, L)
  phases = Phases.from_config(cfg)
  assert (phases.steps, phases.lr_warmup, phases.taper_start, phases.taper_end) == (steps, warmup, start, end)
  assert cfg.train.batch_size * cfg.model.T == 2**19 and cfg.opt.lr == 6e-4 and cfg.opt.weight_decay == 0.01
  assert cfg.taper.mu == 0.1 and cfg.opt.clip == 1.0 and cfg.data.tokenizer == "gpt2"
  assert cfg.taper.scale_loss_weight == (aux if variant in ("internal_taper", "all_taper") else 0.0)  # the paper's λ
  assert gpt2.get_config(f"model={size},variant={variant},aux=0").taper.scale_loss_weight == 0.0  # the ablation
  assert gpt2.get_config(f"model={size},variant=baseline,aux=1").taper.scale_loss_weight == aux  # the matched control
  validate(cfg, num_devices=1)  # every preset is a config that trains (checked before anything compiles)
  if variant == "fakeln":
    removal, value_removal = methods.removal_steps(model_cfg, cfg.fakeln)
    assert max(*removal.values(), *value_removal.values()) == removal[("final_norm",)] < steps


# The FakeLN authors' presets, copied by hand from removing-layer-norm's config.py at 583a9e6 (make_gpt2_standard(_aux),
# make_gpt2_medium_fasttune(_aux), make_gpt2_large(_aux), make_gpt2_xl(_aux)): (start_ln2, gap_ln2, gap_ln1qk,
# gap_ln1v, aux_loss_weight, start_lnf), start_lnf worked out by hand from their formulas.
AUTHORS = {
  ("s", "0"): (20, 2, 2, 3, 0.0, 104),
  ("s", "1"): (20, 2, 2, 3, 0.1, 104),
  ("m", "0"): (20, 2, 2, 3, 0.0, 188),
  ("m", "1"): (20, 2, 2, 3, 0.1, 188),
  ("l", "0"): (30, 4, 4, 6, 0.0, 534),
  ("l", "1"): (30, 4, 4, 6, 0.03, 534),
  ("xl", "0"): (20, 2, 2, 3, 0.0, 356),
  ("xl", "1"): (50, 4, 4, 6, 0.01, 722),
}


@pytest.mark.parametrize("size,aux", list(AUTHORS))
def test_fakeln_presets_are_its_authors_schedules(size, aux):
  cfg = gpt2.get_config(f"model={size},variant=fakeln,aux={aux}")
  start, gap_ln2, gap_ln1qk, gap_ln1v, weight, start_lnf = AUTHORS[size, aux]
  f = cfg.fakeln
  assert (f.start, f.gap_mlp, f.gap_attn, f.gap_attn_v, f.scale_loss_weight) == (
    start,
    gap_ln2,
    gap_ln1qk,
    gap_ln1v,
    weight,
  )
  assert f.eot_id == 50256 and cfg.taper.scale_loss_weight == 0.0  # GPT-2's <|endoftext|>; FakeLN's own scale loss only
  removal, _ = methods.removal_steps(ModelConfig.from_config(cfg.model), f)
  assert removal[("final_norm",)] == start_lnf < cfg.train.steps


@pytest.mark.parametrize("variant, scan", [("all_taper", "unrolled"), ("prepbn", "unrolled"), ("all_taper", "scanned")])
def test_a_pretrained_start_reproduces_the_checkpoints_logits_at_gate_one(variant, scan):
  """A pretrained GPT-2 starts a run (a scanned one holding it stacked) with the checkpoint's logits at g = 1."""
  variables, pretrained_cfg = hf_gpt2.load_gpt2(str(FIXTURE))
  cfg = base.override(
    gpt2.get_config(f"model=demo,variant={variant}"),
    {"model.V": 128, "model.D": 64, "model.H": 4, "model.L": 3, "model.T": 32, "train.batch_size": 2},
  )
  cfg.model.scan_layers = scan
  trainer = Trainer(cfg, sharding.make_mesh(devices=jax.devices()[:1]))
  pretrained.check_fits(trainer.model_cfg, pretrained_cfg, str(FIXTURE))
  state = trainer.state_from_params(variables["params"])
  norm = trainer.per_layer(state)["params"]["block_1"]["mlp_norm"]
  if variant == "all_taper":
    np.testing.assert_array_equal(norm["gamma_tilde"], norm["gamma"])
  else:  # PRepBN's λ is 1 until the paper's taper start, then linear to 0 at its end; RepBN starts at zero
    assert (trainer.method.warm_end, trainer.method.off_step) == MODELS["demo"]["taper"]
    assert not np.any(norm["bn_gamma"]) and float(trainer.method.gates(trainer.method.warm_end + 1).mlp[0]) < 1
  reference = np.load(FIXTURE / "reference_logits.npz")
  logits = Transformer(trainer.model_cfg).apply(
    {"params": state["params"], "calib": state["calib"]}, reference["ids"], 1.0
  )
  np.testing.assert_allclose(logits, reference["logits"], atol=1e-5 * np.abs(reference["logits"]).max())


def test_a_pretrained_model_that_does_not_fit_the_config_is_named():
  _, pretrained_cfg = hf_gpt2.load_gpt2(str(FIXTURE))
  model_cfg = ModelConfig.from_config(gpt2.get_config("model=demo").model)
  with pytest.raises(ValueError, match=r"model\.V: 2000 here, 128 in tiny; model\.L: 4 here, 3 in tiny; model\.T"):
    pretrained.check_fits(model_cfg, pretrained_cfg, "tiny")


@pytest.mark.slow  # three training subprocesses, ~1 minute
def test_demo_pretrain_save_load_and_fine_tune(tmp_path):
  small = [
    f"--config.{k}={v}"
    for k, v in {
      "model.D": 32,
      "model.H": 4,
      "model.L": 2,
      "model.T": 32,
      "model.V": 512,
      "train.batch_size": 8,
      "train.eval_batches": 2,
      "checkpoint.every": 10,
      "data.data_dir": tmp_path / "data",
      "data.synthetic_train_stories": 400,
      "data.synthetic_valid_stories": 60,
    }.items()
  ]
  run = lambda arg, workdir, *extra: subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.gpt2_finetune",
      f"--config=configs/gpt2.py:{arg}",
      f"--workdir={workdir}",
      *small,
      *extra,
    ],
    cwd=ROOT,
    check=True,
    capture_output=True,
    timeout=600,
  )
  run(
    "model=demo,variant=baseline,pretrain=1", tmp_path / "pre", "--config.train.steps=20", "--config.taper.taper_end=10"
  )
  assert hf_gpt2.load_gpt2(str(tmp_path / "pre" / "hf"))[1].D == 32
  run(
    "model=demo,variant=fakeln",
    tmp_path / "fake",
    f"--config.init_from={tmp_path / 'pre' / 'hf'}",
    "--config.train.steps=16",
    "--config.taper.taper_end=12",
    "--config.fakeln.start=2",
    "--config.fakeln.gap_mlp=1",
    "--config.fakeln.gap_attn=1",
    "--config.fakeln.gap_final=1",
  )
  results = json.loads((tmp_path / "fake" / "results.json").read_text())
  assert results["method"] == "fakeln" and results["complete"] and np.isfinite(results["final_val_loss"])
  gates = [json.loads(line)["gate"] for line in open(tmp_path / "fake" / "metrics.jsonl")]
  assert gates[1] == 1.0 and gates[-1] == 0.0


@pytest.mark.slow  # one subprocess, two short runs, ~1 minute
def test_a_fine_tune_runs_from_the_package_alone(tmp_path):
  # As from an installed wheel outside a checkout (configs/ and experiments/ unimportable): GPT-2 configs from the
  # package, the demo's starting model trained and written as a Hugging Face directory, then fine-tuned with TaperLN,
  # every step through the library (the loop, loading, the GPT-2 writer).
  small = {
    "model.D": 32,
    "model.H": 4,
    "model.L": 2,
    "model.T": 32,
    "model.V": 512,
    "train.batch_size": 8,
    "train.eval_batches": 2,
    "checkpoint.every": 10,
    "data.data_dir": str(tmp_path / "data"),
    "data.synthetic_train_stories": 400,
    "data.synthetic_valid_stories": 60,
    "train.steps": 12,
    "taper.taper_end": 9,
  }
  pre, fine = str(tmp_path / "pre"), str(tmp_path / "fine")
  script = (
    "import json\n"
    "from tapernorm_jax.hf import gpt2\n"
    "from tapernorm_jax.inference import loading\n"
    "from tapernorm_jax.train import gpt2_config, loop, run_config\n"
    "config = lambda arg, changes: run_config.override(gpt2_config.get_config(arg), changes)\n"
    f"loop.run(config('model=demo,variant=baseline,pretrain=1', {small!r}), {pre!r})\n"
    f"loaded = loading.load({pre!r})\n"
    f"hf = gpt2.save_gpt2(loaded.variables, loaded.model_cfg, {pre!r} + '/hf')\n"
    f"changes = {{**{small!r}, 'init_from': str(hf)}}\n"
    f"print(json.dumps(loop.run(config('model=demo,variant=internal_taper', changes), {fine!r})))"
  )
  done = run_without_checkout(script, tmp_path, timeout=600)
  results = json.loads(done.stdout.strip().splitlines()[-1])
  assert results["complete"] and results["variant"] == "internal_taper" and results["init_from"].endswith("hf")
  assert results["scale_loss_weight"] == pytest.approx(0.1) and np.isfinite(results["final_val_loss"])
