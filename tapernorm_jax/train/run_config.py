"""The config every run starts from (the paper's setup, docs/method.md §8), its `size=…,aux=…,seed=…` arguments
and dotted overrides.

The library builds configs here; the user-facing files under configs/ (one per variant, `--config=...`)
build on it, so an installed package needs no checkout. The sizes and variants are the method's
(`tapernorm_jax/taper/variants.py`).
"""

from typing import Any

import ml_collections

from tapernorm_jax import config_fields
from tapernorm_jax.data import corpora
from tapernorm_jax.taper import methods
from tapernorm_jax.taper.variants import SIZES, VARIANTS

def parse_arg(arg: str | None, known: tuple[str, ...] = ("size", "aux", "seed"),
              example: str = "configs/all_taper.py:size=9m,aux=0,seed=3") -> dict[str, str]:
  """Parses `size=9m,aux=0,seed=3` into a dict; keys outside `known` are an error that shows `example`."""
  out: dict[str, str] = {}
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in known:
      raise ValueError(f"bad config argument {item!r}: expected comma-separated key=value with keys {sorted(known)},"
                       f" e.g. --config={example}")
    out[key] = value
  return out


def get_config(variant: str = "baseline", arg: str | None = None) -> ml_collections.ConfigDict:
  """The full config for `variant` with `size`, `aux` and `seed` taken from `arg`."""
  args = parse_arg(arg)
  size = args.get("size", "cpu")
  if size not in SIZES:
    raise ValueError(f"size={size!r} is not one of {sorted(SIZES)}")
  if args.get("aux", "1") not in ("0", "1", "on", "off"):
    raise ValueError(f"aux={args['aux']!r}: use aux=1 (on) or aux=0 (off)")
  internal, final, aux_default = VARIANTS[variant]
  aux = args["aux"] in ("1", "on") if "aux" in args else aux_default
  try:
    seed = int(args.get("seed", "0"))
  except ValueError:
    raise ValueError(f"seed={args['seed']!r} is not an integer") from None
  steps = SIZES[size]["steps"]
  cpu = size == "cpu"

  c = ml_collections.ConfigDict()
  c.variant = variant
  c.method = methods.DEFAULT  # how norms are removed: taper (TaperNorm) | fakeln (tapernorm_jax/taper/methods.py)
  c.size = size
  c.seed = seed

  c.model = ml_collections.ConfigDict(dict(
      family="llama", V=2_000 if cpu else 10_000, D=SIZES[size]["D"], H=16, L=2 if cpu else 8, F=0,
      T=128 if cpu else 512, internal_norm=internal, final_norm=final, eps=1e-5, rope_base=10_000.0,
      tie_embeddings=True, logits_bias=False, init_std=0.02, param_dtype="float32",
      dtype="auto",  # compute dtype: auto = bfloat16 on accelerators, float32 on CPU
      attention_impl="auto", remat=False))

  c.data = ml_collections.ConfigDict(dict(  # every field and its meaning: tapernorm_jax/data/corpora.py DEFAULTS
      corpora.DEFAULTS, source="synthetic" if cpu else "tinystories", vocab_size=c.model.get_ref("V"),
      seq_len=c.model.get_ref("T")))

  c.opt = ml_collections.ConfigDict(dict(
      lr=3e-3 if cpu else 3e-4, warmup_frac=0.05, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, clip=1.0))

  c.taper = ml_collections.ConfigDict(dict(methods.TAPER_DEFAULTS, aux_weight=0.1 if aux else 0.0))
  c.fakeln = ml_collections.ConfigDict(methods.FAKELN_DEFAULTS)

  c.train = ml_collections.ConfigDict(dict(
      steps=steps, batch_size=16, log_every=10 if cpu else 100, diag_every=50 if cpu else 1_000,
      eval_batches=8 if cpu else 64, microbatches=1,  # > 1: gradient accumulation inside the jitted step
      profile_steps=0,  # > 0: trace this many steps with jax.profiler into <workdir>/profile (TensorBoard/Perfetto)
      profile_start=10,  # the first traced step (past compilation)
      fixed_step=True))  # once every gate is 0 for good: a second compiled step with the norms in their g = 0 form

  c.mesh = ml_collections.ConfigDict(dict(
      data=-1, fsdp=1, distributed=False,  # distributed: call jax.distributed.initialize (one process per host)
      coordinator_address="", num_processes=-1, process_id=-1))  # its arguments; ""/-1: auto-detected
  c.checkpoint = ml_collections.ConfigDict(dict(
      every=100 if cpu else 5_000, keep=3,
      on_damaged="stop"))  # a latest checkpoint that cannot be read: stop (naming it), or fallback to an older one
  return c


def override(cfg: ml_collections.ConfigDict, changes: dict[str, Any]) -> ml_collections.ConfigDict:
  """Sets dotted fields (`{"train.steps": 600}`, as `--config.train.steps=600` would); unknown fields, and two
  different values for fields that share one (`model.T` and `data.seq_len`), are an error."""
  changes = {config_fields.current_name(dotted): config_fields.current_value(dotted, value)
             for dotted, value in changes.items()}
  for dotted in changes:
    if problem := config_fields.problem(cfg, dotted):
      hint = config_fields.nearest(cfg, dotted)
      raise ValueError(f"config field {dotted!r} does not exist ({problem})"
                       + (f"; did you mean {hint!r}?" if hint else ""))
  for group in config_fields.conflicting(cfg, changes):
    given = " and ".join(f"{dotted}={value!r}" for dotted, value in group)
    raise ValueError(f"{given}: these fields are one shared value (setting one sets the other); give only one")
  for dotted, value in changes.items():
    *sections, field = dotted.split(".")
    node = cfg
    for name in sections:
      node = node[name]
    node[field] = value
  return cfg

