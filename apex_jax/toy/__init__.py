"""The APEx side of the toy backbone: supervised executor / planner / distiller conversations from
the synthetic world's gold hop chains (corpus), their multi-turn encoding (encode) and the agents'
evaluation on held-out questions (evaluate). Its searches are `apex_jax.tools.overlap`."""
