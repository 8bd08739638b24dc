"""Shared fixtures. Eight fake CPU devices must be requested before jax is first imported."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jax  # noqa: E402
import pytest  # noqa: E402

from tests import tiny_models  # noqa: E402


def _sandbox_for_tests():
  """The sandbox refuses to run code without bubblewrap. Outside CI the tests then run under
  reduced isolation (the isolation tests skip); under CI=true nothing is relaxed, so they fail."""
  from morse_jax.execution import sandbox  # pylint: disable=import-outside-toplevel

  if os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get(sandbox.ENV_VAR):
    return
  try:
    sandbox.ensure_available()
  except sandbox.SandboxUnavailableError as e:
    os.environ[sandbox.ENV_VAR] = "reduced"
    print(f"conftest: {e}\nconftest: tests run with {sandbox.ENV_VAR}=reduced")


_sandbox_for_tests()


@pytest.fixture(autouse=True)
def _isolation_chosen_in_code_is_per_test():
  """`experiment.check` of a config with `verifier.isolation` chooses the isolation for the whole
  process (`sandbox.set_isolation`); one test's choice must not run the next test's code."""
  from morse_jax.execution import sandbox  # pylint: disable=import-outside-toplevel

  yield
  sandbox.set_isolation(None)


@pytest.fixture(autouse=True)
def _persistent_compilation_cache_is_per_test():
  """A pipeline under test (`runtime.use_compilation_cache`) points JAX at a persistent cache
  for the rest of its worker's life; both workers then read and write one directory, where a
  fresh clone's run crashed twice inside XLA's cache read. Each test starts without it."""
  yield
  if jax.config.jax_compilation_cache_dir:
    from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()


@pytest.fixture(scope="session")
def hf_folders(tmp_path_factory):
  """family -> (folder of a saved tiny random transformers model, the torch model)."""
  return {family: tiny_models.save_hf_model(family, str(tmp_path_factory.mktemp(family)))
          for family in tiny_models.FAMILIES}


@pytest.fixture(scope="session")
def eight_devices():
  if len(jax.devices()) < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax import")
  return jax.devices()


@pytest.fixture(scope="session")
def vl_folder(tmp_path_factory):
  """(folder of a saved tiny random Qwen2.5-VL, the torch model), shared by the VL tests."""
  return tiny_models.save_hf_vl_model(str(tmp_path_factory.mktemp("qwen25vl")))
