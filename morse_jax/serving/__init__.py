"""The small JSON-over-HTTP servers' shared framework (`http`) and its request intake (`intake`):
used by the search server (`apex_jax.tools.server`) and the OpenAI-style chat server
(`apex_jax.judges.serving`).
"""
