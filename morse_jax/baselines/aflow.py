"""AFlow's HumanEval workflow (github.com/FoundationAgents/AFlow), run fixed:

  3 x CustomCodeGenerate   three drafts of the function (GENERATE_PYTHON_CODE_PROMPT + problem)
  ScEnsemble               the most consistent draft, by letter (SC_ENSEMBLE_PROMPT)
  Test                     up to 3 rounds: the draft on the task's visible examples in our
                           sandbox; on a failure, a reflection that rewrites it
                           (REFLECTION_ON_PUBLIC_TEST_PROMPT); then a last run
  Custom (fix)             only when the test still fails: FIX_CODE_PROMPT on the problem, the
                           failed solution and its error

The operators and their prompts are those of the repository's HumanEval template
(`workspace/HumanEval/workflows/template/operator.py`, `op_prompt.py`); the snapshot read holds
only the search's starting workflow (`round_1`: one CustomCodeGenerate), so the optimised
workflow's sequence and its two prompts above follow the AFlow paper's published HumanEval
workflow as we read it, not its code. AFlow's Test reads a file of public test cases; ours are
the docstring's examples (`tasks.humaneval.visible_tests`). The workflow search itself (Monte
Carlo tree search over workflows as code, an optimizer LLM) is not built.

Greedy decoding would make the three drafts one; they are sampled at `temperature` (AFlow's
calls sample too), every other call is greedy. Calls per task: 4 to 8.
"""

from __future__ import annotations

import re

from morse_jax.baselines import chatchain
from morse_jax.baselines.flow import Ask, Flow, Task, fence

DRAFTS, TEST_LOOPS = 3, 3
GENERATE = ("Generate a Python function to solve the given problem. Ensure the function name "
            "matches the one specified in the problem. Include necessary imports. Use clear "
            "variable names and add comments for clarity.\n\nProblem:\n")
FIX = ("The provided solution failed to pass the tests. Please analyze the error and fix the "
       "code. Ensure the function name and signature remain unchanged. If necessary, add or "
       "modify imports, and use clear variable names.\n\n")
ENSEMBLE = (
    "Given the question described as follows: {problem}\nSeveral solutions have been generated "
    "to address the given question. They are as follows:\n{solutions}\nCarefully evaluate these "
    "solutions and identify the answer that appears most frequently across them. This consistency "
    "in answers is crucial for determining the most reliable solution.\n\nIn the \"thought\" "
    "field, provide a detailed explanation of your thought process. In the \"solution_letter\" "
    "field, output only the single letter ID (A, B, C, etc.) corresponding to the most consistent "
    "solution. Do not include any additional text or explanation in the \"solution_letter\" "
    "field.\nReply in the form <thought>...</thought>\n<solution_letter>...</solution_letter>")
REFLECTION = (
    "Given a code problem and a python code solution which failed to pass test or execute, you "
    "need to analyze the reason for the failure and propose a better code solution.:\n"
    "### problem\n{problem}\n\n### Code Solution\n{solution}\n\n### Execution Result\n{result}\n\n"
    "Please provide a reflection on the failed test cases and code solution, followed by a "
    "better code solution without any additional text or test cases.\n")
_LETTER = re.compile(r"<solution_letter>\s*([A-Z])\s*</solution_letter>", re.IGNORECASE)


def _user(phase: str, text: str, temperature: float = 0.0) -> Ask:
  return Ask(phase, [{"role": "user", "content": text + "\n\n" + chatchain.FORMAT}], temperature)


def letter(reply: str, count: int) -> int | None:
  """The index of the letter in the reply's <solution_letter> field; None without a valid one."""
  match = _LETTER.search(reply)
  index = ord(match[1].upper()) - 65 if match else -1
  return index if 0 <= index < count else None


def flow(task: Task, temperature: float = 0.8) -> Flow:
  problem = task.problem.statement
  replies = yield [_user("generate", GENERATE + problem, temperature) for _ in range(DRAFTS)]
  drafts = [task.revise("generate", r, "") for r in replies]
  shown = "".join(f"{chr(65 + i)}: \n{fence(d)}\n\n" for i, d in enumerate(drafts))
  [reply] = yield [Ask("ensemble", [{"role": "user", "content": ENSEMBLE.format(
      problem=problem, solutions=shown)}])]
  chosen = letter(reply, len(drafts))
  if chosen is None:
    task.fallback("ensemble", "no valid <solution_letter>; the first draft is kept")
    chosen = 0
  solution = best = drafts[chosen]
  for _ in range(TEST_LOOPS):
    passed, report = task.test(solution)
    if passed:
      return fence(solution)
    [reply] = yield [_user("reflect", REFLECTION.format(problem=problem, solution=fence(solution),
                                                        result=report))]
    solution = task.revise("reflect", reply, solution)
  passed, report = task.test(solution)
  if passed:
    return fence(solution)
  [reply] = yield [_user("fix", FIX + problem + f"\nFailed solution: {fence(best)}\nError: "
                                                f"{report}")]
  return fence(task.revise("fix", reply, solution))
