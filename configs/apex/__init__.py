"""APEx experiment configs (apex_jax.experiment.build, apex_jax.pipeline.run)."""
