"""The multi-agent system: subtask graphs, the planner, prompts, agents and the wave runner."""
