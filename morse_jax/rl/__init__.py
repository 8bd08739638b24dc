"""RL core: group advantages (GRPO, HGRPO) and the policy and router losses."""

from morse_jax.rl.advantages import HgrpoAdvantages, grpo, hgrpo, should_skip
from morse_jax.rl.losses import aggregate, k3_kl, policy_loss, router_loss
