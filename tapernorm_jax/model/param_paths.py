"""Where every tensor and calibration scalar of a `Transformer` lives: the one map of its variable paths.

    params/embed (V, D)                                   params/pos_embed (T, D)           gpt2
    params/block_<i>/attn_norm/{gamma, gamma_tilde, beta}  the same for mlp_norm, final_norm  beta: LN only
    params/block_<i>/attn/{qkv (D, 3, H, K), qkv_bias, out (H, K, D), out_bias}                biases: gpt2
    params/block_<i>/mlp/{wi_0, wi_1 (D, F) | wi, wi_bias; wo (F, D), wo_bias}                 llama | gpt2
    params/head (D, V), params/logits_bias (V,)           untied heads; folded final norms
    calib/<norm path>/{num, den, s, count, c}             every norm in a calibrated form (taper, fixed)
    calib/pre_logit/{s, count, s_tgt}                     the pre-logit scale monitor
    params/<norm path>/{alpha, shift}, params/embed_scale  dyt and derf norms (shift: derf), their model's input scale
    params/<norm path>/{bn_gamma, bn_beta, eta}            repbn norms (PRepBN): BatchNorm's affine map and η
    calib/<norm path>/{mean, var, count}                  repbn norms: BatchNorm's running statistics
    params/block_<i>/mlp/{wi_0_bias, wi_1_bias}, attn/qkv_bias  llama with model.input_bias (a folded repbn model)

The model names its modules and variables with these constants; fold, calibration, the
gradient-norm metrics and the tests find them through the functions below.
"""

import dataclasses
from typing import Any

Path = tuple[str, ...]

# Norm parameters (γ, γ̃, β) and calibration scalars.
GAMMA, GAMMA_TILDE, BETA = "gamma", "gamma_tilde", "beta"
ALPHA, SHIFT, EMBED_SCALE = "alpha", "shift", "embed_scale"  # the point-wise norms' (DyT, Derf) scalars
BN_GAMMA, BN_BETA, ETA, MEAN, VAR = "bn_gamma", "bn_beta", "eta", "mean", "var"  # RepBN's (PRepBN)
NUM, DEN, COUNT, C = "num", "den", "count", "c"
S, S_TGT = "s", "s_tgt"
# Modules and projections.
EMBED, POS_EMBED, HEAD, LOGITS_BIAS = "embed", "pos_embed", "head", "logits_bias"
ATTN_NORM, ATTN, MLP_NORM, MLP = "attn_norm", "attn", "mlp_norm", "mlp"
QKV, QKV_BIAS, ATTN_OUT, ATTN_OUT_BIAS = "qkv", "qkv_bias", "out", "out_bias"
WI_GATE, WI_UP, WI, WI_BIAS, WO, WO_BIAS = "wi_0", "wi_1", "wi", "wi_bias", "wo", "wo_bias"
WI_GATE_BIAS, WI_UP_BIAS = "wi_0_bias", "wi_1_bias"  # llama's MLP input biases (model.input_bias)
FINAL_NORM, PRE_LOGIT = "final_norm", "pre_logit"
S_TGT_PATH = (PRE_LOGIT, S_TGT)
CALIBRATED_MODES = ("taper", "fixed")  # norm forms that carry c and γ̃; their g = 0 map folds
FOLDABLE_MODES = (*CALIBRATED_MODES, "repbn")  # norm forms whose inference map is linear and folds
WEIGHT_TYPES = ("qkv", "attn_out", "mlp_in", "mlp_out")


def block(i: int) -> str:
  """The module name of block i."""
  return f"block_{i}"


def mlp_in(family: str) -> tuple[str, ...]:
  """The MLP's input projections: SwiGLU gate and up (llama), or one GELU input (gpt2)."""
  return (WI_GATE, WI_UP) if family == "llama" else (WI,)


def mlp_in_biases(family: str) -> tuple[str, ...]:
  """The biases of the MLP's input projections, in `mlp_in`'s order."""
  return (WI_GATE_BIAS, WI_UP_BIAS) if family == "llama" else (WI_BIAS,)


@dataclasses.dataclass(frozen=True)
class NormSite:
  """A norm and the projections that read it (where its inference map folds), each with its bias."""

  norm: Path
  weights: tuple[Path, ...]
  biases: tuple[Path, ...]  # weights[i]'s bias
  internal: bool

  def mode(self, cfg: Any) -> str:
    """This norm's form in the model `cfg`: its internal or its final norm mode."""
    return cfg.internal_norm if self.internal else cfg.final_norm


def norm_sites(cfg: Any) -> list[NormSite]:
  """Every norm of the model `cfg` (a ModelConfig), internal ones first, block by block, then the final norm."""
  sites = []
  for i in range(cfg.L):
    b = (block(i),)
    sites.append(NormSite(b + (ATTN_NORM,), (b + (ATTN, QKV),), (b + (ATTN, QKV_BIAS),), True))
    sites.append(
      NormSite(
        b + (MLP_NORM,),
        tuple(b + (MLP, w) for w in mlp_in(cfg.family)),
        tuple(b + (MLP, w) for w in mlp_in_biases(cfg.family)),
        True,
      )
    )
  sites.append(NormSite((FINAL_NORM,), ((HEAD,),), ((LOGITS_BIAS,),), False))
  return sites


def norms_in(cfg: Any, modes: tuple[str, ...] = CALIBRATED_MODES) -> list[Path]:
  """Paths of the norms whose form is one of `modes` (default: those that carry calibration state)."""
  return [site.norm for site in norm_sites(cfg) if site.mode(cfg) in modes]


def weight_paths(cfg: Any) -> dict[str, list[tuple[Path, ...]]]:
  """Per weight type (qkv, attn_out, mlp_in, mlp_out), per block, the parameter paths of that type."""
  out: dict[str, list[tuple[Path, ...]]] = {t: [] for t in WEIGHT_TYPES}
  for i in range(cfg.L):
    b = (block(i),)
    out["qkv"].append((b + (ATTN, QKV),))
    out["attn_out"].append((b + (ATTN, ATTN_OUT),))
    out["mlp_in"].append(tuple(b + (MLP, w) for w in mlp_in(cfg.family)))
    out["mlp_out"].append((b + (MLP, WO),))
  return out
