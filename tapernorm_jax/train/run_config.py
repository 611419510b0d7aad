"""The config every run starts from (the paper's setup, docs/method.md §8), its `size=…,aux=…,seed=…` arguments,
dotted overrides, and the checks a config passes before anything compiles.

The library builds configs here; the user-facing files under configs/ (one per variant, `--config=...`)
build on it, so an installed package needs no checkout. The sizes and variants are the method's
(`tapernorm_jax/taper/variants.py`).
"""

from typing import Any

import ml_collections

from tapernorm_jax import config_fields
from tapernorm_jax.data import corpora
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.taper import methods, schedules
from tapernorm_jax.train.checkpoint import ON_DAMAGED
from tapernorm_jax.train import processes, tracking, tuned
from tapernorm_jax.taper.variants import METHODS as VARIANT_METHODS, SIZES, VARIANTS

GATHER_DTYPES = ("compute", "param")  # mesh.gather_dtype


def parse_arg(
  arg: str | None,
  known: tuple[str, ...] = ("size", "aux", "seed", "tuned"),
  example: str = "configs/all_taper.py:size=9m,aux=0,seed=3",
) -> dict[str, str]:
  """Parses `size=9m,aux=0,seed=3` into a dict; keys outside `known` are an error that shows `example`."""
  out: dict[str, str] = {}
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in known:
      raise ValueError(
        f"bad config argument {item!r}: expected comma-separated key=value with keys {sorted(known)},"
        f" e.g. --config={example}"
      )
    out[key] = value
  return out


def variant_arguments(variant: str, arg: str | None) -> tuple[str, bool, int, bool]:
  """(size, aux, seed, tuned) from `size=9m,aux=0,seed=3[,tuned=0]` for `variant`; ValueError naming a bad one."""
  args = parse_arg(arg)
  size = args.get("size", "cpu")
  if size not in SIZES:
    raise ValueError(f"size={size!r} is not one of {sorted(SIZES)}")
  if args.get("aux", "1") not in ("0", "1", "on", "off"):
    raise ValueError(f"aux={args['aux']!r}: use aux=1 (on) or aux=0 (off)")
  aux = args["aux"] in ("1", "on") if "aux" in args else VARIANTS[variant][2]
  if args.get("tuned", "1") not in ("0", "1", "on", "off"):
    raise ValueError(f"tuned={args['tuned']!r}: use tuned=1 (the tuned presets, train/tuned.py) or tuned=0 (defaults)")
  tuned_presets = args.get("tuned", "1") in ("1", "on")
  try:
    return size, aux, int(args.get("seed", "0")), tuned_presets
  except ValueError:
    raise ValueError(f"seed={args['seed']!r} is not an integer") from None


def get_config(variant: str = "baseline", arg: str | None = None) -> ml_collections.ConfigDict:
  """The full config for `variant` with `size`, `aux` and `seed` taken from `arg`, with the method's tuned preset at
  that size (train/tuned.py; `tuned=0`: the defaults)."""
  size, aux, seed, tuned_presets = variant_arguments(variant, arg)
  internal, final, _ = VARIANTS[variant]
  steps = SIZES[size]["steps"]
  cpu = SIZES[size].get("cpu_scale", False)

  c = ml_collections.ConfigDict()
  c.variant = variant
  c.method = VARIANT_METHODS.get(variant, methods.DEFAULT)  # how norms are removed: taper, fakeln, prepbn
  c.size = size
  c.seed = seed

  c.model = ml_collections.ConfigDict(
    dict(
      family="llama",
      V=2_000 if cpu else 10_000,
      D=SIZES[size]["D"],
      H=SIZES[size].get("H", 16),
      L=SIZES[size].get("L", 8),
      F=0,
      T=128 if cpu else 512,
      internal_norm=internal,
      final_norm=final,
      norm_alpha=(),
      derf_shift=0.0,
      norm_gain_init=1.0,
      final_norm_gain_init=0.0,
      repbn_gain_init=0.0,
      eps=1e-5,
      rope_base=10_000.0,
      tie_embeddings=True,
      logits_bias=False,
      init_std=0.02,
      param_dtype="float32",
      dtype="auto",  # compute dtype: auto = bfloat16 on accelerators, float32 on CPU
      attention_impl="auto",
      remat="none",  # none, full or save_matmuls: what each block keeps for the backward pass (docs/tpu.md)
      scan_layers="auto",  # scanned: the blocks run as one block, compiled once; auto: on accelerators from 12 deep
    )
  )

  c.data = ml_collections.ConfigDict(
    dict(  # every field and its meaning: tapernorm_jax/data/corpora.py DEFAULTS
      corpora.DEFAULTS,
      source="synthetic" if cpu else "tinystories",
      vocab_size=c.model.get_ref("V"),
      seq_len=c.model.get_ref("T"),
    )
  )

  c.opt = ml_collections.ConfigDict(
    dict(lr=3e-3 if cpu else 3e-4, warmup_frac=0.05, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, clip=1.0)
  )

  for section, defaults in methods.DEFAULTS.items():  # taper, fakeln, prepbn: each method's section
    c[section] = ml_collections.ConfigDict(dict(defaults, scale_loss_weight=0.1 if aux else 0.0))

  c.train = ml_collections.ConfigDict(
    dict(
      steps=steps,
      batch_size=16,
      log_every=10 if cpu else 100,
      diag_every=50 if cpu else 1_000,
      eval_batches=8 if cpu else 64,
      microbatches=1,  # > 1: gradient accumulation inside the jitted step
      profile_steps=0,  # > 0: trace this many steps with jax.profiler into <workdir>/profile (TensorBoard/Perfetto)
      profile_start=10,  # the first traced step (past compilation)
      fixed_step=True,  # once every gate is 0 for good: a second compiled step with the norms in their g = 0 form
      compilation_cache="auto",  # jax's persistent cache: auto (<cache dir>/xla), off, or a directory or URL
      cpu_paths="auto",
    )
  )  # the products and attention: auto (timed on this host, cached), or one to force (paths.py)

  c.mesh = ml_collections.ConfigDict(
    dict(
      data=-1,
      fsdp=1,
      distributed=False,  # distributed: call jax.distributed.initialize (one process per host)
      coordinator_address="",
      num_processes=-1,
      process_id=-1,  # its arguments; ""/-1: auto-detected
      process_timeout_s=processes.DEFAULT_TIMEOUT_S,  # a process unheard this long is lost: the others stop
      gather_dtype="compute",  # what FSDP gathers: compute (weights cast where they lie; bf16: half the bytes), param
    )
  )
  c.checkpoint = ml_collections.ConfigDict(
    dict(every=100 if cpu else 5_000, keep=3, on_damaged="stop")
  )  # a latest checkpoint that cannot be read: stop (naming it), or fallback to an older one
  c.tracking = ml_collections.ConfigDict(
    dict(  # beside metrics.jsonl and TensorBoard (train/tracking.py)
      wandb_project="",  # set (or $WANDB_PROJECT): log to Weights & Biases (pip install 'tapernorm-jax[wandb]')
      wandb_entity="",
      wandb_tags=(),
      wandb_mode="",  # online, offline (wandb sync later), disabled; "": $WANDB_MODE
      wandb_group="",
    )
  )  # "": none for a run, the study directory's name for a sweep's cells
  c.tuned = ""  # the tuned preset applied (its tuning-study tag), "" for none
  if tuned_presets and (chosen := tuned.preset(variant, aux, size)):
    c.tuned, changes = chosen
    try:
      override(c, changes)
    except ValueError as e:
      raise ValueError(f"{tuned.TUNED_FILE}, {variant}:aux={int(aux)} at {size}: {e}") from None
  return c


def validate(cfg: ml_collections.ConfigDict, num_devices: int) -> None:
  """Raises ValueError naming the offending field for configs that cannot train; runs before compiling."""
  reference = get_config()  # every variant's config has the same fields and types; a fine-tune's adds init_from
  if "init_from" in cfg:
    reference.init_from = ""
  config_fields.check_like(cfg, reference)
  model_cfg = ModelConfig.from_config(cfg.model)
  phases = schedules.Phases.from_config(cfg) if cfg.train.steps > 0 else None
  checks = [
    (cfg.train.steps > 0, "train.steps", "must be positive"),
    (cfg.train.batch_size > 0, "train.batch_size", "must be positive"),
    (cfg.train.microbatches >= 1, "train.microbatches", "must be >= 1 (1: no gradient accumulation)"),
    (
      cfg.train.batch_size % (num_devices * max(cfg.train.microbatches, 1)) == 0,
      "train.batch_size",
      f"must be divisible by the data-parallel size ({num_devices} devices) × train.microbatches "
      f"({cfg.train.microbatches}); change it, train.microbatches or mesh.data/mesh.fsdp",
    ),
    (0.0 <= cfg.opt.warmup_frac <= 1.0, "opt.warmup_frac", "must lie in [0, 1]"),
    (cfg.opt.lr > 0, "opt.lr", "must be positive"),
    (cfg.opt.weight_decay >= 0, "opt.weight_decay", "must be >= 0"),
    (
      0.0 <= cfg.taper.gate_warmup_frac <= 1.0,
      "taper.gate_warmup_frac",
      "must lie in [0, 1]: the gate warmup cannot be longer than the run",
    ),
    (cfg.train.profile_steps >= 0, "train.profile_steps", "must be >= 0 (0 turns profiling off)"),
    (cfg.train.profile_start >= 0, "train.profile_start", "must be >= 0"),
    (0.0 <= cfg.opt.b1 < 1.0, "opt.b1", "Adam's β1 must lie in [0, 1)"),
    (0.0 <= cfg.opt.b2 < 1.0, "opt.b2", "Adam's β2 must lie in [0, 1)"),
    (cfg.opt.clip > 0, "opt.clip", "the global-norm clip must be positive"),
    *[(cfg.train[f] >= 1, f"train.{f}", "must be >= 1") for f in ("log_every", "diag_every", "eval_batches")],
    (cfg.checkpoint.every >= 1, "checkpoint.every", "must be >= 1 (a checkpoint every this many steps)"),
    (cfg.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1 (the number of checkpoints kept)"),
    (0 <= cfg.seed < 2**32, "seed", "must be an integer in [0, 2**32)"),
    (
      0.0 <= cfg.data.get("tune_frac", 0.0) < 0.5,
      "data.tune_frac",
      "must lie in [0, 0.5) (the share of the train stream held out for tuning; 0: none)",
    ),
  ]
  config_fields.check(cfg, checks)
  if cfg.taper.taper_end != -1 and not 0 < cfg.taper.taper_end <= cfg.train.steps:
    raise ValueError(
      f"taper.taper_end={cfg.taper.taper_end}: must be -1 (the last step) or in (0, train.steps={cfg.train.steps}]"
    )
  if phases.taper_start > phases.taper_end:
    raise ValueError(
      f"taper.gate_warmup_frac={cfg.taper.gate_warmup_frac}: the taper would start at step "
      f"{phases.taper_start}, after taper.taper_end={phases.taper_end}"
    )
  if (mode := cfg.get("tracking", {}).get("wandb_mode", "")) not in tracking.WANDB_MODES:
    raise ValueError(
      f"tracking.wandb_mode={mode!r}: choose online, offline or disabled (\"\": $WANDB_MODE, else online)"
    )
  if cfg.checkpoint.get("on_damaged", "stop") not in ON_DAMAGED:
    raise ValueError(
      f"checkpoint.on_damaged={cfg.checkpoint.on_damaged!r}: choose one of {ON_DAMAGED} (fallback "
      "resumes from the newest checkpoint that restores and moves damaged ones aside)"
    )
  processes.check_timeout(cfg.mesh.get("process_timeout_s", processes.DEFAULT_TIMEOUT_S))
  if (gather := cfg.mesh.get("gather_dtype", "compute")) not in GATHER_DTYPES:
    raise ValueError(
      f"mesh.gather_dtype={gather!r}: choose compute (weights cast to the compute dtype before FSDP gathers them)"
      " or param (gathered in their own dtype, then cast)"
    )
  methods.validate(cfg, model_cfg, phases)


def override(cfg: ml_collections.ConfigDict, changes: dict[str, Any]) -> ml_collections.ConfigDict:
  """Sets dotted fields (`{"train.steps": 600}`, as `--config.train.steps=600` would); unknown fields, and two
  different values for fields that share one (`model.T` and `data.seq_len`), are an error."""
  changes = {
    config_fields.current_name(dotted): config_fields.current_value(dotted, value) for dotted, value in changes.items()
  }
  for dotted in changes:
    if problem := config_fields.problem(cfg, dotted):
      hint = config_fields.nearest(cfg, dotted)
      raise ValueError(
        f"config field {dotted!r} does not exist ({problem})" + (f"; did you mean {hint!r}?" if hint else "")
      )
  for group in config_fields.conflicting(cfg, changes):
    given = " and ".join(f"{dotted}={value!r}" for dotted, value in group)
    raise ValueError(f"{given}: these fields are one shared value (setting one sets the other); give only one")
  for dotted, value in changes.items():
    *sections, field = dotted.split(".")
    config_fields.lookup(cfg, sections)[field] = value
  return cfg
