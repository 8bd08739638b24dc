"""One tiny random backbone with the three APEx role experts, shared by every training test, and
fixed trajectories whose generated tokens carry on-policy log-probs (so updates are not clipped
away). Every test that updates uses 2 groups x 2 rows of 8 tokens: one compile of the step."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from morse_jax import llm, lora
from morse_jax.lora.mixture import Adapter, uniform_routes
from morse_jax.rl import train_step as ts
from morse_jax.rl.rollout import Segment

from apex_jax.agents.trajectory import Trajectory
from apex_jax.training.grpo import ModuleUpdater
from tests import tiny_models

CONFIG = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8)
LORA = lora.LoraConfig(roles=("planner", "executor", "distiller"), num_subtask_experts=0,
                       last_n_layers=1, rank=4, alpha=8.0)
# Weight decay on: it would shrink every expert, so freezing has to hold despite it.
STEP = ts.StepConfig(estimator="grpo", expert_lr=3e-2, weight_decay=0.1)
PROMPT, GEN = 5, 3
_token_logprobs = jax.jit(ts.token_logprobs, static_argnames=("config", "temperature"))


def _numpy_like(tree, seed: int, scale: float, norms=False):
  """Random arrays shaped like `tree` (abstract or not), drawn with numpy: jax.random would
  compile one small program per distinct shape, seconds on a busy CPU."""
  rng = np.random.RandomState(seed)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
  out = []
  for path, leaf in leaves:
    noise = rng.normal(size=leaf.shape).astype(np.float32)
    norm = norms and "norm" in jax.tree_util.keystr(path)
    out.append(jax.numpy.asarray(1.0 + 0.2 * noise if norm else scale * noise))
  return jax.tree_util.tree_unflatten(treedef, out)


class Tiny:
  def __init__(self):
    shapes = jax.eval_shape(lambda: llm.init_random(CONFIG, jax.random.key(0)))
    # weights 0.3 N(0, 1), norms 1 + 0.2 N(0, 1), as init_random(scale=0.3, norm_jitter=0.2)
    self.backbone = _numpy_like(shapes, 0, 0.3, norms=True)
    # Non-zero A and B, so each expert changes the model's output from the start.
    self.experts = _numpy_like(jax.eval_shape(lambda: lora.init_experts(
        LORA, CONFIG, jax.random.key(1))), 1, 0.05)

  def updater(self, **overrides) -> ModuleUpdater:
    return ModuleUpdater(llm.Model(CONFIG, self.backbone), LORA, overrides.pop("step", STEP),
                         **overrides)

  def logprobs(self, experts, module: str, tokens: np.ndarray) -> np.ndarray:
    """[n, T] log p of tokens under the module's expert (0 at t = 0)."""
    adapter = Adapter(experts=experts, routes=uniform_routes([[LORA.role_index(module)]] *
                                                             len(tokens)),
                      layers=LORA.adapted_layers(CONFIG), scale=LORA.scale, kernel="gather")
    mask = np.ones_like(tokens)
    return np.asarray(_token_logprobs(self.backbone, CONFIG, adapter, tokens, mask)[0])

  def groups(self, module: str, seed: int = 0, experts=None):
    """2 groups x 2 trajectories of `module`: 5 prompt tokens + 3 generated ones each."""
    tokens = tiny_models.random_tokens(seed, (4, PROMPT + GEN))
    tokens[1, :PROMPT] = tokens[0, :PROMPT]  # a group shares its prompt
    tokens[3, :PROMPT] = tokens[2, :PROMPT]
    logp = self.logprobs(self.experts if experts is None else experts, module, tokens)
    trajs = [Trajectory(module, [Segment(t[:PROMPT].tolist()),
                                 Segment(t[PROMPT:].tolist(), lp[PROMPT:].tolist())],
                        text=f"row {i}", answer=None)
             for i, (t, lp) in enumerate(zip(tokens, logp))]
    return [trajs[:2], trajs[2:]]


@pytest.fixture(scope="session")
def tiny():
  return Tiny()
