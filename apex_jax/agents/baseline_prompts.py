"""The comparison systems' own prompts in the wording of ECNU-SII/MIA (cited per prompt), and a
compact form of each for the compact prompt style (AgentConfig.prompts), as
`apex_jax.agents.prompts` has both for APEx's. The executor's and planner's prompts around them
are APEx's (the style's)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from apex_jax.agents import prompts as apex_prompts

# Inference/Trace/prompt.py puts `{mem_prompt}` just before "Here is the question:";
# Inference/Trace/react_agent.py: mem_prompt = f"\nHere are some memorys for your reference:
# \n{truncated_context}\n" (the context cut to 8192 words)
RAG_MEMORY = "\nHere are some memorys for your reference:\n{context}\n\n"
RAG_WORDS = 8192
# Inference/Expel/react_agent.py: the memory server's rule after the question
RULE_GUIDE = "\nHere is a rule for your reference:\n{rule}\nBegin your answer:\n"
# Memory-Serve/memory_serve.py batch_memory_save: each tool output of a stored trace cut to
# 1024 words (truncate_by_whitespace_words)
TRACE_WORDS = 1024

# Memory-Serve/Memento.py SYSTEM_PROMPT and planning_system_prompt (the meta-planner)
MEMENTO_SYSTEM = """
You are a planning assistant in a three-step loop:  

1. **Plan**: Given a goal and background info, output a clear action plan.  
2. **Evaluate**: Given an execution trace, decide if replanning is needed.  
3. **Replan (if needed)**: With new reference memories, provide a revised plan targeting unmet goals.  

Keep responses concise and action-focused.
"""
MEMENTO_PLAN = """
You are the META-PLANNER in a hierarchical AI system. A user will ask a high-level question. **First**: break the problem into a *minimal sequence*\n

The agent has access to the following tools:
- `search`: perform text-based web queries to retrieve external information.

### [Relevant Memories] 
Each memory indicates whether it was **correct** or **incorrect**, along with its plan:
{memory}

Output should be **clear and concise**, and present your response as a step-by-step plan.

**[Question]** (Global Objective): 
{question}
"""

# Memory-Serve/Plan-only.py planning_system_prompt, sent as the only message; its build_plan
# fills it with no memory: memory_len 0 and "None found."
PLAN_ONLY = """
You are a senior expert assisting an agent by providing strategic guidance. 

The agent has access to the following tools:
- `search`: perform text-based web queries to retrieve external information.

### [Relevant Memories] 
({memory_len} retrieved experiences) Each memory indicates whether it was **correct** or **incorrect**, along with its workflow:
{memory}

### Your Task:
- Analyze the **Question** and compare it with both **correct strategies** and **incorrect patterns** in the memories.
- If similar successful approaches exist, adapt their core idea to guide the next steps.
- If the context resembles past failures, highlight what to avoid and suggest corrective actions.
- Recommend **one clear, generalizable work plan or action strategy** that directly addresses the current situation and guides the agent on what to do next.

### Output should:
1. Be clear and concise—no more than 200 words.
2. You must include relevant memories in the thinking process (<think>...</think>), but do not mention them in the final output.
3. Don't try to give the answer directly, but give a plan.
4. Prohibit the generation of content unrelated to the plan.
5. Your response must not contain any factual information.

Your output should only contain the guideline, with no additional explanations.

**[Question]** (Global Objective): 
{question}
"""
EXPEL_SIMILAR = 3  # Expel.py: the rules of the top-3 similar memories are shown
NO_MEMORY = "\n### Retrieved Relevant Memories:\nNone found."

# Memory-Serve/Expel.py EXPEL_PROMPT. MIA constrains the reply with a JSON schema
# (RULE_OPT_SCHEMA, vLLM's response_format); a sampler here cannot, so the schema is asked for
# in words (EXPEL_REPLY, ours) and the reply parsed strictly (apex_jax.baselines.expel).
EXPEL_PROMPT = """
Here are the two previous trials to compare and critique:

SUCCESSFUL TRIAL:
{success_history}

FAILED TRIAL:
{fail_history}

Here are the EXISTING RULES (retrieved from similar past questions):
{existing_rules}

By examining and contrasting the successful trial against the failed trial and existing rules, please generate **ONE** optimal rule for the current question.

You must choose exactly **ONE** operation:
1. **AGREE**: If an existing rule is perfect for this case. (Provide the existing rule number).
2. **EDIT**: If an existing rule needs modification to be better. (Provide the rule number and the NEW content).
3. **ADD**: If no existing rule applies and a new one is needed. (Provide the NEW content).

Your goal is to ensure the agent avoids the failure in the future.
"""
EXPEL_REPLY = ('\nReply with one JSON object only: {"operation": "AGREE" | "EDIT" | "ADD", '
               '"rule_number": <the existing rule\'s number for AGREE or EDIT, 0 for ADD>, '
               '"rule_content": "<the new or edited rule; empty for AGREE>"}')

COMPACT_RAG_MEMORY = "Memories:\n{context}\n"
COMPACT_RULE_GUIDE = "\nRule:\n{rule}\n"
COMPACT_MEMENTO_PLAN = ("Memories (judgement, question, plan):\n{memory}\nWrite a numbered search "
                        "plan (no facts, no answer) for:\n{question}")
COMPACT_EXPEL = ("Success:\n{success_history}\nFailure:\n{fail_history}\nRules:\n{existing_rules}"
                 "\nOne rule for this question: AGREE, EDIT or ADD.")
COMPACT_EXPEL_REPLY = '\nJSON: {"operation": ..., "rule_number": ..., "rule_content": ...}'


@dataclasses.dataclass(frozen=True)
class BaselinePrompts:
  """The comparison systems' prompts of one style (named as AgentConfig.prompts names it)."""
  name: str
  rag_memory: str  # {context}: before the executor prompt's question line
  rule_guide: str  # {rule}: after the question
  memento_system: str
  memento_plan: str  # {memory} {question}
  expel: str  # {success_history} {fail_history} {existing_rules}
  expel_reply: str
  trace_words: int  # words of each tool output a stored raw trajectory keeps
  plan_only: str | None  # {memory_len} {memory} {question}; None: APEx's plan prompt, no memory


AUTHORS = BaselinePrompts("authors", RAG_MEMORY, RULE_GUIDE, MEMENTO_SYSTEM, MEMENTO_PLAN,
                          EXPEL_PROMPT, EXPEL_REPLY, TRACE_WORDS, PLAN_ONLY)
COMPACT = BaselinePrompts("compact", COMPACT_RAG_MEMORY, COMPACT_RULE_GUIDE,
                          apex_prompts.COMPACT_PLANNER_SYSTEM, COMPACT_MEMENTO_PLAN, COMPACT_EXPEL,
                          COMPACT_EXPEL_REPLY, apex_prompts.COMPACT_TRACE_WORDS, None)
STYLES = {s.name: s for s in (AUTHORS, COMPACT)}


def baseline_prompts(style: str) -> BaselinePrompts:
  if style not in STYLES:
    raise ValueError(f"prompt style {style!r} (AgentConfig.prompts) not in {tuple(STYLES)}")
  return STYLES[style]


def rag_messages(question: str, context: str, style: str) -> list[dict]:
  """The executor's opening with retrieved trajectories (Inference/Trace): the memory block
  before the style's question line (its prompt's last line), cut to RAG_WORDS words."""
  text = apex_prompts.prompt_style(style).executor
  cut = " ".join(context.split()[:RAG_WORDS])
  at = text.rstrip("\n").rfind("\n") + 1  # the question line's start
  block = baseline_prompts(style).rag_memory.format(context=cut)
  return [{"role": "user", "content": text[:at] + block + text[at:] + question}]


def rule_messages(question: str, rule: str | None, style: str) -> list[dict]:
  """The executor's opening with ExpeL's retrieved rule after the question (none: the bare
  executor prompt)."""
  messages = apex_prompts.executor_messages(question, None, style)
  if rule:
    messages[0]["content"] += baseline_prompts(style).rule_guide.format(rule=rule)
  return messages


def memento_messages(question: str, cases: str, style: str) -> list[dict]:
  """Memento's meta-planner chat: [system, plan prompt with the retrieved cases]."""
  p = baseline_prompts(style)
  return [{"role": "system", "content": p.memento_system},
          {"role": "user", "content": p.memento_plan.format(memory=cases, question=question)}]


def plan_only_messages(question: str, words: int, style: str) -> list[dict]:
  """The planner's opening without any memory: Plan-only.py's prompt, or (a style without one)
  APEx's plan prompt with no skill and no memory."""
  template = baseline_prompts(style).plan_only
  if template is None:
    return apex_prompts.plan_messages(apex_prompts.NO_SKILL, NO_MEMORY.strip(), question, words,
                                      style)
  return [{"role": "user", "content": template.format(memory_len=0, memory=NO_MEMORY,
                                                      question=question)}]


def render_cases(correct: Sequence, incorrect: Sequence) -> str:
  """Memento's cases in Memento.py `get_memories_context`'s layout: judgement, question and
  plan (a memory's workflow summary holds its plan), positives first."""
  if not correct and not incorrect:
    return NO_MEMORY
  text = "\n### Retrieved Relevant Memories:\n"
  for title, cases in (("Positive Examples (Successful Strategies", correct),
                       ("Negative Examples (Failure Lessons", incorrect)):
    if cases:
      text += f"\n#### {title} - {len(cases)}):\n" + "".join(
          f"\n--- Example {i} (Text-only modality) ---\n- Judgement: {m.outcome}\n"
          f"- Question: {m.question}\n- Plan: {m.workflow_summary}\n"
          for i, m in enumerate(cases, 1))
  return text


def expel_messages(question: str, trace: str, correct: bool, rules: Sequence[str],
                   style: str) -> list[dict]:
  """Expel.py `extract_and_update_rules`' prompt: the trace as the successful or the failed
  trial (the other empty), the similar memories' rules numbered from 1 (none: "None")."""
  p = baseline_prompts(style)
  trial = f"Question: {question}\nTrace: {trace}"
  existing = "".join(f"{i}: {r}\n" for i, r in enumerate(rules, 1)) or "None"
  text = p.expel.format(success_history=trial if correct else "",
                        fail_history="" if correct else trial, existing_rules=existing)
  return [{"role": "user", "content": text + p.expel_reply}]
