"""APEx in JAX: deep-research QA agents with procedural memory, built on morse_jax's backbone."""
