"""The few-row kernel (`matvec.rows`): products against float64 numpy, decode with it against XLA's products."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax.inference import decode
from tapernorm_jax.inference.cpu_kernels import matvec
from tapernorm_jax.model.transformer import MATVEC, ModelConfig
from model_helpers import perturbed_variables

needs_kernel = pytest.mark.skipif(not matvec.available(), reason=f"matvec kernel unavailable: {matvec.reason()}")


@pytest.fixture
def reload_kernel():
  """Lets a test change how the kernel loads; the next user loads it afresh."""
  matvec._load.cache_clear()
  yield
  matvec._load.cache_clear()


@needs_kernel
@pytest.mark.parametrize("R", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("K,O", [(64, 300), (37, 17), (515, 1)])
def test_rows_equal_a_float64_product(R, K, O):
  rng = np.random.default_rng(R * K + O)
  x_RxK, w_OxK = rng.standard_normal((R, K), np.float32), rng.standard_normal((O, K), np.float32)
  expected_RxO = x_RxK.astype(np.float64) @ w_OxK.astype(np.float64).T
  got_RxO = np.asarray(jax.jit(matvec.rows)(x_RxK, w_OxK))
  np.testing.assert_allclose(got_RxO, expected_RxO, rtol=0, atol=1e-5 * np.abs(expected_RxO).max())


@pytest.mark.parametrize("x_shape,w_shape,dtype", [((9, 8), (4, 8), jnp.float32), ((2, 8), (4, 7), jnp.float32),
                                                   ((2, 8), (4, 8), jnp.bfloat16)])
def test_rows_name_what_they_cannot_take(x_shape, w_shape, dtype):
  with pytest.raises(ValueError, match=r"matvec\.rows: x .* needs 1 to 8 float32 rows"):
    matvec.rows(jnp.ones(x_shape, dtype), jnp.ones(w_shape, dtype))


_prefill = jax.jit(decode.prefill, static_argnums=1)
_step = jax.jit(decode.decode_step, static_argnums=1)


def _decode_both_ways(cfg: ModelConfig, B: int) -> tuple[list, list, dict]:
  """Step-by-step logits after a ragged prefill, from XLA's products and from the kernel; and the kernel's variables."""
  variables = perturbed_variables(cfg)
  with_kernel = decode.with_matvec_weights(variables, cfg)
  prompt_BxP, lengths_B = decode.pad_prompts([[1 + b + i for i in range(3 + 2 * b)] for b in range(B)])
  runs = []
  for v in (variables, with_kernel):
    cache = decode.init_cache(cfg, B, 16)
    logits_BxV, cache = _prefill(v, cfg, prompt_BxP, lengths_B, cache)
    steps = [logits_BxV]
    for i in range(3):
      tokens_B = jnp.argmax(steps[-1], -1).astype(jnp.int32)
      logits_BxV, cache = _step(v, cfg, tokens_B, lengths_B + i, cache)
      steps.append(logits_BxV)
    runs.append(steps)
  return runs[0], runs[1], with_kernel


CONFIGS = {  # tied head, remat'ed blocks; untied head with biases
    "llama": ModelConfig(V=83, D=48, H=4, L=2, T=32, init_std=0.2, remat=True, internal_norm="taper",
                         final_norm="taper"),
    "gpt2": ModelConfig(family="gpt2", V=83, D=48, H=4, L=2, T=32, init_std=0.2, tie_embeddings=False,
                        internal_norm="taper", final_norm="taper")}


@needs_kernel
@pytest.mark.parametrize("family", ["llama", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_decode_with_the_kernel_matches_xla_products(family):
  cfg = CONFIGS[family]
  plain, kernel, with_kernel = _decode_both_ways(cfg, B=4)
  for a_BxV, b_BxV in zip(plain, kernel):
    np.testing.assert_allclose(b_BxV, a_BxV, rtol=0, atol=1e-5 * float(jnp.abs(a_BxV).max()))
  # Every projection of a decode step goes through the kernel: 4 per block (llama: 5) and the head.
  step = jax.make_jaxpr(lambda v, c: decode.decode_step(v, cfg, jnp.zeros(4, jnp.int32), jnp.ones(4, jnp.int32),
                                                        c))(with_kernel, decode.init_cache(cfg, 4, 16))
  calls = str(step).count(matvec.TARGET)
  assert calls == cfg.L * (5 if family == "llama" else 4) + 1
  prefill = jax.make_jaxpr(lambda v, c: decode.prefill(v, cfg, jnp.zeros((4, 6), jnp.int32), jnp.full(4, 6), c))(
      with_kernel, decode.init_cache(cfg, 4, 16))
  assert str(prefill).count(matvec.TARGET) == 1  # 24 rows go to XLA; only the head's 4 last positions


@needs_kernel
def test_the_copies_are_each_projection_as_output_by_input():
  cfg = CONFIGS["llama"]
  variables = perturbed_variables(cfg)
  copies = decode.with_matvec_weights(variables, cfg)[MATVEC]
  params = variables["params"]
  np.testing.assert_array_equal(copies["block_0"]["attn"]["out"],
                                np.asarray(params["block_0"]["attn"]["out"]).reshape(48, 48).T)
  np.testing.assert_array_equal(copies["block_0"]["mlp"]["wi_0"], np.asarray(params["block_0"]["mlp"]["wi_0"]).T)
  np.testing.assert_array_equal(copies["embed"], params["embed"])  # the tied head's table, as it is


def test_without_the_kernel_decoding_keeps_xla_products(reload_kernel, monkeypatch):
  monkeypatch.setenv("TAPERNORM_MATVEC", "0")
  assert not matvec.available() and "TAPERNORM_MATVEC=0" in matvec.reason()
  variables = {"params": {}}
  assert decode.with_matvec_weights(variables, CONFIGS["llama"]) is variables
  with pytest.raises(RuntimeError, match="not available .*TAPERNORM_MATVEC=0"):
    matvec.rows(jnp.ones((2, 8)), jnp.ones((4, 8)))


def test_a_missing_compiler_is_a_reason_not_a_crash(reload_kernel, monkeypatch, tmp_path):
  monkeypatch.setenv("CXX", "no-such-compiler")
  monkeypatch.setenv("TAPERNORM_CACHE", str(tmp_path))
  assert not matvec.available()
  assert "no C++ compiler ('no-such-compiler' is not on PATH; set CXX)" in matvec.reason()


@needs_kernel
def test_bfloat16_models_keep_xla_products():
  variables = {"params": {}}
  assert decode.with_matvec_weights(variables, CONFIGS["llama"].replace(dtype="bfloat16")) is variables
