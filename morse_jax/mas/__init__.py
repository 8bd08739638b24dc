"""The multi-agent system: task graphs, planner, agents, runner, verifier and sandbox."""
