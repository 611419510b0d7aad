"""The fused CPU attention (`cpu_kernels/attention.py`): outputs and gradients against the model's reference
attention, where the seam selects it, and a train step through it against one through `blocked`."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax import cpu_kernels
from tapernorm_jax.cpu_kernels import attention as kernel
from tapernorm_jax.model import ModelConfig, attention, sharding
from tapernorm_jax.train import run_config
from tapernorm_jax.train.trainer import Trainer
from kernels import needs_compiler


@needs_compiler
# narrow heads (K = 4, 6: sums along keys) and wide ones (K = 16…64: along features, 8 or 4 query rows at a time),
# with T below, at and past a multiple of those rows
@pytest.mark.parametrize(
  "B,T,H,K",
  [
    (2, 64, 4, 4),
    (1, 37, 2, 16),
    (3, 20, 1, 6),
    (1, 130, 2, 32),
    (1, 1, 1, 4),
    (2, 3, 3, 16),
    (2, 45, 2, 64),
    (1, 19, 3, 48),
  ],
)
def test_outputs_and_gradients_match_the_reference(B, T, H, K):
  rng = np.random.default_rng(B * T + H * K)
  q, k, v, w = (jnp.asarray(rng.standard_normal((B, T, H, K)), jnp.float32) for _ in range(4))
  reference = lambda q, k, v: attention.causal_attention(q, k, v, "xla", "cpu")
  np.testing.assert_allclose(jax.jit(kernel.causal_attention)(q, k, v), reference(q, k, v), atol=2e-6, rtol=0)
  grads = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(w * f(*a)), argnums=(0, 1, 2)))(q, k, v)
  for got, expected in zip(grads(kernel.causal_attention), grads(reference), strict=True):
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@needs_compiler
def test_a_query_sees_only_itself_and_earlier_keys():
  rng = np.random.default_rng(0)
  q, k, v = (rng.standard_normal((1, 40, 2, 8)).astype(np.float32) for _ in range(3))
  changed = v.copy()
  changed[:, 25:] += 10.0  # later values must not move earlier outputs
  out, out2 = (
    np.asarray(kernel.causal_attention(*(jnp.asarray(x) for x in (q, k, values)))) for values in (v, changed)
  )
  np.testing.assert_array_equal(out[:, :25], out2[:, :25])
  assert not np.allclose(out[:, 25:], out2[:, 25:])


def test_float32_only_and_unavailable_kernels_are_named():
  with pytest.raises(ValueError, match="float32 only, not bfloat16; use model.attention_impl"):
    kernel.causal_attention(*(jnp.zeros((1, 4, 1, 4), jnp.bfloat16) for _ in range(3)))


@needs_compiler
@pytest.mark.parametrize(
  "changes,selected",
  [
    ({}, True),
    ({"platform": "cpu"}, True),
    ({"attention_impl": "blocked"}, False),
    ({"attention_impl": "xla"}, False),
    ({"dtype": "bfloat16"}, False),
    ({"platform": "tpu", "dtype": "float32"}, False),
    ({"platform": "gpu", "dtype": "float32"}, False),
  ],
)
def test_the_seam_selects_the_kernel_only_for_auto_float32_for_a_cpu_target(changes, selected):
  cfg = ModelConfig(V=16, D=16, H=2, L=1, T=8, **changes)
  assert (cpu_kernels.attention_for(cfg) is kernel.causal_attention) == selected


def test_turning_the_kernel_off_falls_back_to_the_model(monkeypatch, reload_kernels):
  monkeypatch.setenv("TAPERNORM_CPU_ATTENTION", "0")
  assert kernel.reason() == "disabled by TAPERNORM_CPU_ATTENTION=0"
  assert cpu_kernels.attention_for(ModelConfig(V=16, D=16, H=2, L=1, T=8)) is None


def step_of(attention_impl: str) -> tuple[Trainer, dict, dict]:
  """A cpu-preset all_taper trainer mid-taper, one step's new state and metrics."""
  cfg = run_config.get_config("all_taper", "size=cpu")
  cfg.model.T, cfg.train.batch_size, cfg.model.attention_impl = 32, 8, attention_impl
  trainer = Trainer(cfg, sharding.make_mesh())
  state = trainer.init_state(0)
  state["step"] = jax.device_put(
    jnp.int32((trainer.phases.taper_start + trainer.phases.taper_end) // 2), state["step"].sharding
  )
  batch = jax.device_put(
    np.random.default_rng(0).integers(0, cfg.model.V, (8, 33), dtype=np.int32), trainer.batch_sharding
  )
  hlo = trainer.train_step.lower(state, batch).as_text()
  new_state, metrics = trainer.train_step(state, batch)
  return trainer, jax.device_get(new_state), {**jax.device_get(metrics), "hlo": hlo}


@needs_compiler
def test_a_train_step_through_the_kernel_equals_one_through_blocked():
  fused_trainer, fused, fused_metrics = step_of("auto")
  blocked_trainer, blocked, blocked_metrics = step_of("blocked")
  assert inspect.unwrap(fused_trainer.attend) is kernel.causal_attention and blocked_trainer.attend is None
  assert all(f"tapernorm_attention_{part}" in fused_metrics["hlo"] for part in ("forward", "backward"))
  assert "tapernorm_attention" not in blocked_metrics["hlo"]
  np.testing.assert_allclose(fused_metrics["loss"], blocked_metrics["loss"], rtol=1e-6)
  np.testing.assert_allclose(fused_metrics["grad_norm"], blocked_metrics["grad_norm"], rtol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4), fused["params"], blocked["params"])
