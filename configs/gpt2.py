"""GPT-2 fine-tuning (docs/method.md §10): `--config=configs/gpt2.py:model=s,variant=internal_taper,seed=0`.

Arguments: `model=s|m|l|xl` (pretrained GPT-2 from the hub, the paper's per-size schedule) or
`demo` (a 4-layer GPT-2-shaped model on the offline corpus, minutes on a CPU); `variant=baseline|
internal_taper|all_taper|fakeln`; `aux=0|1`, the scale loss (default: on for internal_taper and all_taper
with the paper's λ, and for FakeLN its own; off for baseline, whose `aux=1` is the matched control);
`seed=N`. Every field can be overridden with `--config.X.Y=`.
(`method=` and `vanilla`, the names before, still work with a deprecation message.)
"""

import ml_collections

from configs import base
from tapernorm_jax import config_fields
from tapernorm_jax.errors import deprecated

# The paper's per-size shapes and schedule: steps, LR warmup end, taper start, taper end (docs/method.md §10);
# microbatches keep 2^19 tokens per step (512 blocks of 1024) within one device's memory.
MODELS = {
    "s": dict(hub="gpt2", D=768, H=12, L=12, steps=300, warmup=25, taper=(25, 100), aux=0.1, microbatches=16),
    "m": dict(hub="gpt2-medium", D=1024, H=16, L=24, steps=500, warmup=10, taper=(20, 200), aux=0.1,
              microbatches=32),
    "l": dict(hub="gpt2-large", D=1280, H=20, L=36, steps=600, warmup=30, taper=(30, 500), aux=0.1, microbatches=64),
    "xl": dict(hub="gpt2-xl", D=1600, H=25, L=48, steps=800, warmup=20, taper=(50, 700), aux=0.01,
               microbatches=128),
    # The CPU demo: fine-tunes a model that configs/gpt2.py:model=demo,variant=baseline,pretrain=1 trained first.
    "demo": dict(hub="", D=64, H=4, L=4, steps=200, warmup=10, taper=(20, 150), aux=0.1, microbatches=1),
}
# FakeLN as its authors schedule it (github.com/submarat/removing-layer-norm, config.py at 583a9e6), per size and
# with (True) or without (False) their aux loss: (start_ln2, gap_ln2, gap_ln1qk, gap_ln1v, aux_loss_weight). Their
# start_ln1qk = start_ln2 + L·gap_ln2, start_ln1v = start_ln1qk + L·gap_ln1qk, start_lnf = start_ln1v + L·gap_ln1v,
# which is fakeln.gap_final = gap_ln1v after the last value-path removal.
FAKELN = {
    ("s", False): (20, 2, 2, 3, 0.0), ("s", True): (20, 2, 2, 3, 0.1),  # make_gpt2_standard, _standard_aux
    ("m", False): (20, 2, 2, 3, 0.0), ("m", True): (20, 2, 2, 3, 0.1),  # make_gpt2_medium_fasttune(_aux)
    ("l", False): (30, 4, 4, 6, 0.0), ("l", True): (30, 4, 4, 6, 0.03),  # make_gpt2_large(_aux)
    ("xl", False): (20, 2, 2, 3, 0.0), ("xl", True): (50, 4, 4, 6, 0.01),  # make_gpt2_xl(_aux)
    # The demo (4 layers, 200 steps): the large model's gaps, here, so that each removal has steps to settle.
    ("demo", False): (20, 4, 4, 6, 0.0), ("demo", True): (20, 4, 4, 6, 0.1),
}
GPT2_EOT = 50_256  # <|endoftext|>, which FakeLN's aux loss leaves out of its target (SentencePiece's eos is 2)
VARIANTS = {  # (internal norm, final norm, method, the scale loss on by default)
    "baseline": ("plain", "plain", "taper", False),  # aux=1: the matched control, the scale loss without tapering
    "internal_taper": ("taper", "plain", "taper", True),  # the paper's Internal-TaperLN (+fixed-target aux)
    "all_taper": ("taper", "taper", "taper", True),
    "fakeln": ("taper", "taper", "fakeln", True),  # its own aux loss, fakeln.aux_weight
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The fine-tuning config for `model`, `variant` and `seed` in `arg`."""
  args = base.parse_arg(arg, ("model", "variant", "method", "seed", "pretrain", "aux"),
                        "configs/gpt2.py:model=s,variant=internal_taper")
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
  c = base.get_config("baseline", f"size=cpu,seed={args.get('seed', '0')}")
  c.variant, c.size, c.method = variant, size, method
  c.init_from = "" if pretrain else (spec["hub"] or "runs/gpt2_demo/pretrain/hf")  # an HF directory or hub name
  c.model.update(family="gpt2", V=2_000 if demo else 50_257, D=spec["D"], H=spec["H"], L=spec["L"], F=0,
                 T=128 if demo else 1024, internal_norm=internal, final_norm=final, tie_embeddings=True,
                 dtype="auto")
  c.data.update(source="synthetic" if demo else "openwebtext", tokenizer="sentencepiece" if demo else "gpt2",
                tokenizer_dir="gpt2")
  c.opt.update(lr=3e-3 if pretrain else 6e-4, warmup_frac=(30 if pretrain else spec["warmup"]) / steps,
               weight_decay=0.01)
  start, end = spec["taper"]
  taper_aux = spec["aux"] if aux and method == "taper" else 0.0
  c.taper.update(mu=0.1, aux_weight=taper_aux, gate_warmup_frac=start / steps, taper_end=end)
  start_ln2, gap_ln2, gap_ln1qk, gap_ln1v, fakeln_aux = FAKELN[size, aux]
  c.fakeln.update(start=start_ln2, gap_mlp=gap_ln2, gap_attn=gap_ln1qk, gap_attn_v=gap_ln1v, gap_final=gap_ln1v,
                  mu=0.1, sigma_steps=1, aux_weight=fakeln_aux, eot_id=2 if demo else GPT2_EOT)
  c.train.update(steps=steps, batch_size=16 if demo else 512, microbatches=spec["microbatches"],
                 log_every=10, diag_every=25 if demo else 50, eval_batches=8)
  c.checkpoint.update(every=100 if demo else 50)
  return c
