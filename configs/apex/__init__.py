"""APEx experiment configs (apex_jax.experiment.build / run)."""
