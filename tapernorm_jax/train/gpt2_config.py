"""GPT-2 fine-tuning configs (docs/method.md §10), from `model=s|m|l|xl|demo,variant=...,aux=0|1,seed=N,pretrain=0|1`.

`model=s|m|l|xl` is pretrained GPT-2 from the hub with the paper's per-size schedule; `demo` a 4-layer GPT-2-shaped
model on the offline corpus (minutes on a CPU). `variant=baseline|internal_taper|all_taper|fakeln|prepbn`;
`aux=0|1`, the scale loss (default: on for internal_taper and all_taper with the paper's λ, and for FakeLN its own;
off for baseline, whose `aux=1` is the matched control, and for PRepBN, which has none). The tables are
`tapernorm_jax/taper/gpt2_variants.py`; configs/gpt2.py is the name `--config=` files use, so an installed package
fine-tunes GPT-2 without a checkout.
(`method=` and `vanilla`, the names before, still work with a deprecation message.)
"""

import ml_collections

from tapernorm_jax import config_fields
from tapernorm_jax.errors import deprecated
from tapernorm_jax.taper.gpt2_variants import FAKELN, GPT2_EOT, MODELS, VARIANTS
from tapernorm_jax.train import run_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The fine-tuning config for `model`, `variant` and `seed` in `arg`."""
  args = run_config.parse_arg(
    arg, ("model", "variant", "method", "seed", "pretrain", "aux"), "configs/gpt2.py:model=s,variant=internal_taper"
  )
  if "method" in args:
    deprecated("configs/gpt2.py: the argument method= is now variant=; the old name still works for now")
    args.setdefault("variant", args.pop("method"))
  size = args.get("model", "s")
  variant = config_fields.current_value("variant", args.get("variant", "internal_taper"))
  if size not in MODELS:
    raise ValueError(f"model={size!r} is not one of {sorted(MODELS)}")
  if variant not in VARIANTS:
    raise ValueError(f"variant={variant!r} is not one of {sorted(VARIANTS)}")
  if args.get("aux", "1") not in ("0", "1"):
    raise ValueError(f"aux={args['aux']!r}: write aux=0 (no scale loss) or aux=1")
  pretrain = args.get("pretrain", "0") == "1"
  if pretrain and variant != "baseline":
    raise ValueError("pretrain=1 trains the starting model and needs variant=baseline")
  spec, demo = MODELS[size], size == "demo"
  internal, final, method, aux = VARIANTS[variant]
  aux = aux if "aux" not in args else args["aux"] == "1"
  steps = 600 if pretrain else spec["steps"]
  c = run_config.get_config("baseline", f"size=cpu,seed={args.get('seed', '0')}")
  c.variant, c.size, c.method = variant, size, method
  c.init_from = "" if pretrain else (spec["hub"] or "runs/gpt2_demo/pretrain/hf")  # an HF directory or hub name
  c.model.update(
    family="gpt2",
    V=2_000 if demo else 50_257,
    D=spec["D"],
    H=spec["H"],
    L=spec["L"],
    F=0,
    T=128 if demo else 1024,
    internal_norm=internal,
    final_norm=final,
    tie_embeddings=True,
    dtype="auto",
  )
  c.data.update(
    source="synthetic" if demo else "openwebtext", tokenizer="sentencepiece" if demo else "gpt2", tokenizer_dir="gpt2"
  )
  c.opt.update(
    lr=3e-3 if pretrain else 6e-4, warmup_frac=(30 if pretrain else spec["warmup"]) / steps, weight_decay=0.01
  )
  start, end = spec["taper"]
  taper_weight = spec["scale_loss_weight"] if aux and method == "taper" else 0.0
  c.taper.update(
    mu=0.1, scale_loss_weight=taper_weight, gate_warmup_frac=start / steps, taper_end=end, min_calibration_step=0
  )  # the paper's steps: a pretrained residual stream has settled
  if method == "fakeln":  # each method's section only where it is the run's (another's would do nothing)
    start_ln2, gap_ln2, gap_ln1qk, gap_ln1v, fakeln_weight = FAKELN[size, aux]
    c.fakeln.update(
      start=start_ln2,
      gap_mlp=gap_ln2,
      gap_attn=gap_ln1qk,
      gap_attn_v=gap_ln1v,
      gap_final=gap_ln1v,
      mu=0.1,
      sigma_steps=1,
      scale_loss_weight=fakeln_weight,
      eot_id=2 if demo else GPT2_EOT,
    )
  if method == "prepbn":
    c.prepbn.update(warm_frac=start / steps, blend_end=end, scale_loss_weight=spec["scale_loss_weight"] if aux else 0.0)
  c.train.update(
    steps=steps,
    batch_size=16 if demo else 512,
    microbatches=spec["microbatches"],
    log_every=10,
    diag_every=25 if demo else 50,
    eval_batches=8,
  )
  c.checkpoint.update(every=100 if demo else 50)
  return c
