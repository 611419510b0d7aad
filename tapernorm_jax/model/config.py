"""The model's hyperparameters (`ModelConfig`, the `model.*` config section) and their checks, before any tracing."""

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from tapernorm_jax import config_fields
from tapernorm_jax.errors import deprecated
from tapernorm_jax.model import attention, param_paths, sharding
from tapernorm_jax.model.norms import NORM_MODES, POINTWISE_ALPHA, POINTWISE_MODES, RENAMED_MODES

FAMILIES = ("llama", "gpt2")
DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
REMAT_POLICIES = ("none", "full", "save_matmuls")  # model.remat: what a block keeps for its backward (layer_scan.py)
SCAN_CHOICES = ("auto", "scanned", "unrolled")  # model.scan_layers; auto: scanned on accelerators from SCAN_FROM_L
# Layers deep, from which `auto` scans the blocks on an accelerator target: compile time grows with unrolled depth
# (GPT-2 XL on v5e:4x4 compiles in 56-59 s scanned against 234-368 s unrolled, docs/tpu.md). Never on a
# CPU target, where the unrolled 8-layer `1m` train step ran 1.44-1.58 s against 1.64-1.75 s scanned (docs/tpu.md).
SCAN_FROM_L = 12


INITIAL_VALUE_FIELDS = (  # they change no program
  "norm_alpha",
  "derf_shift",
  "norm_gain_init",
  "final_norm_gain_init",
  "repbn_gain_init",
  "init_std",
)
# How the blocks run, not what they compute or store: a run may resume with these changed.
EXECUTION_FIELDS = ("remat", "scan_layers")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Model hyperparameters: V vocab, D width, H heads, L layers, F MLP width (0: family default), T max length.

  `platform` is the target, not part of the model: the platform of the devices the program is compiled for
  (`cpu`, `gpu`, `tpu`), which decides what `dtype=auto` and `attention_impl=auto` stand for. Whoever builds a
  program for a mesh sets it from the mesh (`for_devices`); left empty it means jax's default devices, where an
  eager `Transformer(cfg).apply` runs. It is never saved with a run or an export (`to_dict`).
  """

  family: str = "llama"
  V: int = 10_000
  D: int = 64
  H: int = 16
  L: int = 8
  F: int = 0
  T: int = 512
  head_dim: int = 0  # K, each head's width; 0: D / H (a tensor-split serving shard holds a share of the heads)
  internal_norm: str = "plain"
  final_norm: str = "plain"
  norm_alpha: tuple[float, ...] = ()  # dyt/derf: α's initial value (attention, MLP, final); (): the authors' (norms.py)
  derf_shift: float = 0.0  # derf: the shift's initial value
  norm_gain_init: float = 1.0  # every norm's gain γ starts at this (the normalized path's; a tapered norm's γ̃ at 1)
  final_norm_gain_init: float = 0.0  # the final norm's γ starts at this instead; 0: at norm_gain_init
  repbn_gain_init: float = 0.0  # repbn: BatchNorm's affine weight starts at this (0, PRepBN's: RepBN starts silent)
  eps: float = 1e-5
  rope_base: float = 10_000.0
  tie_embeddings: bool = True
  logits_bias: bool = False
  input_bias: bool = False  # llama: biases on qkv and the MLP inputs (gpt2 has them always); a folded PRepBN has them
  init_std: float = 0.02
  dtype: str = "float32"
  param_dtype: str = "float32"
  attention_impl: str = "auto"
  remat: str = "none"  # none, full (recompute each block in the backward pass) or save_matmuls (keep the products)
  scan_layers: str = (
    "auto"  # scanned: the L blocks as one block under a scan (one compiled body); a scanned run keeps its state stacked
  )
  platform: str = ""

  def __post_init__(self):
    for field in ("internal_norm", "final_norm"):
      old = getattr(self, field)
      if old in RENAMED_MODES:  # configs written before the rename carry the old name
        deprecated(
          f"model.{field}={old!r} is now called {RENAMED_MODES[old]!r}; the old name still works for now", stacklevel=4
        )
        object.__setattr__(self, field, RENAMED_MODES[old])
    if self.attention_impl is None:  # configs written before attention.py said None for automatic
      object.__setattr__(self, "attention_impl", "auto")
    object.__setattr__(self, "norm_alpha", tuple(self.norm_alpha))  # a list when read from JSON
    for field in ("remat", "scan_layers"):  # bools in configs written before they named a choice
      object.__setattr__(self, field, config_fields.current_value(f"model.{field}", getattr(self, field)))
    validate(self)

  @property
  def norm_kind(self) -> str:
    """`rms` for llama, `ln` for gpt2."""
    return "rms" if self.family == "llama" else "ln"

  @property
  def K(self) -> int:
    """Each head's width: `head_dim`, or D / H."""
    return self.head_dim or self.D // self.H

  @property
  def mlp_dim(self) -> int:
    """F, or its family default: round(8D/3) for SwiGLU, 4D for GELU."""
    if self.F:
      return self.F
    return round(8 * self.D / 3) if self.family == "llama" else 4 * self.D

  @property
  def scanned(self) -> bool:
    """Whether the blocks run under a scan: `scan_layers`, with `auto` scanned on an accelerator target from
    SCAN_FROM_L layers deep."""
    if self.scan_layers == "auto":
      return self.target_platform != "cpu" and self.L >= SCAN_FROM_L
    return self.scan_layers == "scanned"

  @property
  def target_platform(self) -> str:
    """The platform the model is compiled for: `platform`, or that of jax's default devices when it is empty."""
    return self.platform or sharding.platform_of(None)

  @property
  def compute_dtype(self) -> Any:
    """The activation dtype; `auto` is bfloat16 on accelerator targets and float32 on a CPU target."""
    if self.dtype == "auto":
      return jnp.dtype(jnp.float32 if self.target_platform == "cpu" else jnp.bfloat16)
    return jnp.dtype(self.dtype)

  def for_platform(self, platform: str) -> "ModelConfig":
    """This model compiled for `platform` (`cpu`, `gpu`, `tpu`; '' for jax's default devices)."""
    return self.replace(platform=platform)

  def for_devices(self, devices: Any) -> "ModelConfig":
    """This model compiled for `devices` (a mesh, an array or a list of devices): their platform."""
    return self.for_platform(sharding.platform_of(devices))

  def to_dict(self) -> dict[str, Any]:
    """The model's fields, as a run or an export records them (without the target platform)."""
    return {k: v for k, v in dataclasses.asdict(self).items() if k != "platform"}

  @classmethod
  def from_config(cls, cfg: "ModelConfig | Mapping[str, Any]") -> "ModelConfig":
    """Builds from a ModelConfig, a dict or an ml_collections ConfigDict (`config.model`)."""
    if isinstance(cfg, cls):
      return cfg
    items = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(items) - known)
    if unknown:
      raise ValueError(f"unknown model config field(s) {unknown}; known fields: {sorted(known)}")
    return cls(**items)

  def replace(self, **changes: Any) -> "ModelConfig":
    """A copy with fields changed (validated again)."""
    return dataclasses.replace(self, **changes)

  def program_key(self) -> str:
    """The config as its compiled programs see it: the fields that only set initial values (INITIAL_VALUE_FIELDS)
    at their defaults, so a tuning grid over them shares one timed kernel choice."""
    initial = {f.name: f.default for f in dataclasses.fields(self) if f.name in INITIAL_VALUE_FIELDS}
    return repr(dataclasses.replace(self, **initial))

  def fixed_form(self) -> "ModelConfig":
    """The g = 0 model: every `taper` norm in its `fixed` form (the same variables)."""
    swap = lambda mode: "fixed" if mode == "taper" else mode
    return self.replace(internal_norm=swap(self.internal_norm), final_norm=swap(self.final_norm))

  @property
  def pointwise(self) -> bool:
    """Whether any norm is a point-wise one (`dyt`, `derf`): the embeddings then get a learned scale."""
    return self.internal_norm in POINTWISE_MODES or self.final_norm in POINTWISE_MODES

  def alpha_init(self, position: int) -> float:
    """α's initial value of a point-wise norm at `position` (0 attention, 1 MLP, 2 final)."""
    if self.norm_alpha:
      return float(self.norm_alpha[position])
    mode = self.final_norm if position == 2 else self.internal_norm
    return POINTWISE_ALPHA.get(mode, (1.0, 1.0, 1.0))[position]

  @property
  def foldable(self) -> bool:
    """Whether any norm's inference map is linear and folds into the next projection (`fold.fold`)."""
    return self.internal_norm in param_paths.FOLDABLE_MODES or self.final_norm in param_paths.FOLDABLE_MODES

  @property
  def input_biases(self) -> bool:
    """Whether the projections that read a norm (qkv, the MLP inputs) have biases."""
    return self.family == "gpt2" or self.input_bias

  @property
  def tapered(self) -> bool:
    """Whether any norm is in a calibrated form (`taper` or `fixed`): it has c and γ̃ and folds."""
    return self.internal_norm in param_paths.CALIBRATED_MODES or self.final_norm in param_paths.CALIBRATED_MODES


def validate(cfg: ModelConfig) -> None:
  """Raises ValueError naming the first bad field; runs before anything is traced or compiled."""

  def fail(field: str, problem: str) -> None:
    raise ValueError(f"model.{field}={getattr(cfg, field)!r}: {problem}")

  if cfg.family not in FAMILIES:
    fail("family", f"unknown family; choose one of {FAMILIES}")
  for field in ("V", "D", "H", "L", "T"):
    if not isinstance(getattr(cfg, field), int) or getattr(cfg, field) <= 0:
      fail(field, "must be a positive integer")
  if not isinstance(cfg.F, int) or cfg.F < 0:
    fail("F", "must be a non-negative integer (0 picks the family default)")
  if cfg.head_dim < 0:
    fail("head_dim", "a head's width is positive, or 0 for D / H")
  if not cfg.head_dim and cfg.D % cfg.H:
    fail("H", f"the number of heads must divide model.D={cfg.D}")
  if cfg.family == "llama" and cfg.K % 2:
    fail("H", f"RoPE needs an even head dimension, but it is {cfg.K}")
  for field in ("internal_norm", "final_norm"):
    if getattr(cfg, field) not in NORM_MODES:
      fail(field, f"unknown norm mode; choose one of {NORM_MODES}")
  if len(cfg.norm_alpha) not in (0, 3) or not all(a > 0 for a in cfg.norm_alpha):
    fail("norm_alpha", "give three values > 0 (the attention, MLP and final norms' α), or () for the authors'")
  if not cfg.eps > 0:
    fail("eps", "must be > 0 (it keeps the norm's square root away from zero)")
  if not cfg.norm_gain_init > 0:
    fail("norm_gain_init", "must be > 0 (the norms' gain γ starts at this; 1 is the usual init)")
  if not cfg.final_norm_gain_init >= 0:
    fail("final_norm_gain_init", "must be > 0 (the final norm's γ starts at this), or 0 for norm_gain_init")
  if not cfg.repbn_gain_init >= 0:
    fail("repbn_gain_init", "must be >= 0 (RepBN's BatchNorm weight starts at this; 0 is PRepBN's)")
  if not cfg.init_std > 0:
    fail("init_std", "must be > 0")
  if cfg.dtype not in DTYPES:
    fail("dtype", f"choose one of {DTYPES}")
  if cfg.param_dtype not in DTYPES[1:]:
    fail("param_dtype", f"choose one of {DTYPES[1:]}")
  if cfg.attention_impl not in attention.IMPLS:
    fail("attention_impl", f"choose one of {attention.IMPLS} (docs/method.md §13)")
  if cfg.remat not in REMAT_POLICIES:
    fail("remat", f"choose one of {REMAT_POLICIES} (True and False, its old values, mean full and none)")
  if cfg.scan_layers not in SCAN_CHOICES:
    fail("scan_layers", f"choose one of {SCAN_CHOICES} (True and False mean scanned and unrolled)")
  if cfg.platform not in ("", *sharding.PLATFORMS):
    fail("platform", f"choose one of {sharding.PLATFORMS}, or '' for jax's default devices")
  if cfg.logits_bias and cfg.tie_embeddings:
    fail("logits_bias", "a logits bias comes with an untied head; set model.tie_embeddings=False")
