"""RL core: group advantages (GRPO, HGRPO), policy and router losses, the jitted update."""

from morse_jax.rl.advantages import HgrpoAdvantages, grpo, hgrpo, should_skip
from morse_jax.rl.losses import aggregate, k3_kl, policy_loss, router_loss
