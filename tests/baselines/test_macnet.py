"""MacNet on a scripted backbone: the topologies, the refusal of a graph that is not a DAG, the
critique -> rewrite on each edge, the aggregation of several predecessors in id order and its
counted fallback."""

import re

import pytest

from morse_jax.baselines import macnet, topology
from morse_jax.baselines.flow import Task, drive
from morse_jax.baselines.run import BaselineConfig
from tests.baselines.scripted import Scripted
from tests.baselines.test_chatchain import PROBLEM


def test_topologies():
  assert topology.generate("chain", 4) == [(0, 1), (1, 2), (2, 3)]
  assert topology.generate("star", 4) == [(0, 1), (0, 2), (0, 3)]
  assert topology.generate("tree", 6) == [(0, 1), (0, 2), (1, 3), (1, 4), (2, 5)]
  assert topology.generate("mesh", 3) == [(0, 1), (0, 2), (1, 2)]
  draws = {tuple(topology.generate("random", 5, seed)) for seed in range(8)}
  assert len(draws) > 1 and tuple(topology.generate("random", 5, 3)) in draws
  for edges in draws:
    topology.check_dag(edges)
    assert 4 <= len(edges) <= 10 and all(u < v for u, v in edges)
  with pytest.raises(ValueError, match="'ring' is not one of"):
    topology.generate("ring", 4)
  with pytest.raises(ValueError, match="nodes=0"):
    topology.generate("chain", 0)


@pytest.mark.parametrize("edges,message", [
    ("0->1,1->2,2->0", "edge 2->0 closes the cycle 2->0->1->2"),
    ("0->1,1->1", "edge 1->1 is a self-loop"),
    ("0->1,1-2", "edge '1-2' is not of the form"),
])
def test_a_topology_that_is_not_a_dag_is_refused_naming_the_edge(edges, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    BaselineConfig(macnet_edges=edges)


def test_network_adds_the_output_agent_and_orders_by_depth():
  network = macnet.Network.build(topology.parse("0->1,0->2,1->3,2->3"))
  assert network.predecessors(3) == [1, 2] and network.predecessors(macnet.OUTPUT) == [3]
  assert network.depths() == [[0], [1, 2], [3], [macnet.OUTPUT]]


def numbered():
  """Each rewrite returns a function whose constant is the count of rewrites so far."""
  count = [0]

  def respond(ask):
    if ask.phase == "critique":
      return "Handle empty input."
    if ask.phase == "aggregate":
      return "```python\ndef add(a, b):\n    return 99\n```"
    count[0] += 1
    return f"```python\ndef add(a, b):\n    return {count[0]}\n```"
  return respond


def run(edges, respond):
  chat, task = Scripted(respond), Task(PROBLEM, None)
  [final] = drive([macnet.flow(task, macnet.Network.build(topology.parse(edges)))], [task], chat)
  return chat, task, final


def test_diamond_calls_and_aggregation_order():
  chat, task, final = run("0->1,0->2,1->3,2->3", numbered())
  assert chat.phases() == ["rewrite",                              # 0 writes from scratch
                           "critique", "critique", "rewrite", "rewrite",  # 0->1, 0->2
                           "critique", "critique", "rewrite", "rewrite",  # 1->3, 2->3
                           "aggregate",                            # 3 has two predecessors
                           "critique", "rewrite"]                  # 3 -> output
  assert chat.rounds == [1, 2, 2, 2, 2, 1, 1, 1]  # one batched call per layer and step
  first = chat.asks[0].messages[-1]["content"]
  assert 'Codes:\n""' in first and '"None."' in first
  assert all("return 1" in p for p in chat.prompts("critique")[:2])  # 0's code reviewed
  assert "Handle empty input." in chat.prompts("rewrite")[1]
  # 0->1 and 0->2 rewrote 0's code into 2 (agent 1) and 3 (agent 2); A is 3's rewrite of 1's
  [aggregate] = chat.prompts("aggregate")
  from_1, from_2 = (chat.reply_to("rewrite", f"return {k}") for k in (2, 3))
  assert aggregate.index(from_1) < aggregate.index(from_2)
  assert "Program A" in aggregate and "Program B" in aggregate
  assert "return 99" in chat.prompts("critique")[-1]  # the output agent reviews the merge
  assert "return 6" in final and not task.fallbacks


def test_an_aggregation_without_code_falls_back_to_the_first_predecessor():
  respond = numbered()
  chat, task, final = run("0->1,0->2", lambda ask: "I merged them." if ask.phase == "aggregate"
                          else respond(ask))
  # 0 -> 1 and 0 -> 2 rewrite into 2 and 3; the output's rewrites of them are 4 and 5
  assert task.fallbacks == {"aggregate": 1}
  assert "return 4" in final and chat.phases()[-1] == "aggregate"


def test_a_source_without_code_is_rewritten_without_critique():
  replies = iter(["no code"] + ["```python\ndef add(a, b):\n    return a + b\n```"] * 3)
  chat, task, final = run("0->1", lambda ask: next(replies))
  assert chat.phases() == ["rewrite", "rewrite", "critique", "rewrite"]
  assert task.fallbacks == {"write": 1} and "return a + b" in final
