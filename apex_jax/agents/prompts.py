"""The agents' prompts, verbatim from the APEx authors' code (J-Ding519/APEx), and the execution
trace the Planner and the Distiller read.

- Executor, image question: the same file's SYSTEM_PROMPT_IMAGE + USER_PROMPT_IMAGE_SHORT +
  question (read from ECNU-SII/MIA's copy of Serve/Train_Planner/prompt.py: the APEx snapshot
  could not be fetched here), the image's `<image>` marker ending the prompt's opening.
- Executor: Serve/Train_Planner/prompt.py SYSTEM_PROMPT_TEXT + USER_PROMPT_TEXT_NEW + question, the
  plan appended as in Serve/Train_Planner/call_agent.py `run_multimodal_dialogue`, the revised
  plan as in `continue_multimodal_dialogue`, tool output as verl's search tool renders it
  (Executor-Train/Train/verl/tools/search_tool.py `execute`).
- Planner: Planner-Train/mem-plan/local_search/prompt.py (SYSTEM_PLAN_PROMPT, PLAN_PROMPT,
  REPLAN_PROMPT) and Serve/Train_Planner/agent_serve.py (REFLECTION_JUDGE_PROMPT, the trace).
- Distiller: Writer-Train/Train/writer_skill/prompt.py (skill synthesis / evolution) and
  Memory-Serve/memory_serve.py (`get_trace_prompt`, the workflow summary).

Two styles (AgentConfig.prompts), each one `PromptStyle` holding all its prompts, the
Distiller's included: AUTHORS (the default, verbatim) and COMPACT: the same protocol, tags and
reply formats in a few dozen words, for the CPU toy backbone, whose code BPE spends about 1,360
tokens on the authors' executor prompt alone. The builders at the end take the style (or its
name); `apex_jax.toy.corpus` renders its training turns with the same builders.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

from morse_jax import textscan

from apex_jax.memory.records import Memory, Skill
from apex_jax.memory.schema import as_bucket
from apex_jax.memory.skills import format_batch
from apex_jax.tools.images import strip_markers

# ------------------------------------------------------------------------------------ executor

EXECUTOR_SYSTEM = """You are a helpful assistant. You can call functions to assist with the user query.
Important: You must call only one function at a time. After each function call, wait for the execution result before making the next function call if needed.
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "search", "description": "Searches the web for relevant information based on the given query.", "parameters": {"type": "object", "properties": {"query_list": {"type": "array", "description": "A list of complete textual queries. Each query must clearly state the topic."}}, "required": ["query_list"]}}}
</tools>
For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
"""

EXECUTOR_USER = """# Workflow and Output Format
You must follow these steps in order. In every conversation turn, you start from Step 1.

**Step 1: Think (Plan)**
* **This is the starting point for every turn.**
* Analyze the user's query and all available information (including previous observations) carefully.
* Formulate a plan. Your plan must decide on **one** of two courses of action:
    1.  **Call a tool:** If you need more information.
    2.  **Provide a final answer:** If you have sufficient information.
* Your entire reasoning process must be enclosed in `<think>...</think>` tags.

**Step 2: Act (Tool Call)**
* **Execute this step ONLY if your Step 1 plan was to call a tool.**
* Call the **one single tool** decided upon in your plan.
* The tool call must be enclosed in `<tool_call>...</tool_call>` tags.
* **Important: If you call a tool, you must STOP and wait for the observation. Do NOT proceed to Step 4.**

**Step 3: Observe (Tool Output)**
* **You will only enter this step after a tool call.**
* You will receive the tool's output (observation).
* After receiving the output, you **MUST** go back to **Step 1 (Think)** to analyze the new information and decide the next step (e.g., call another tool or provide the final answer).

**Step 4: Answer (Final Response)**
* **Execute this step ONLY if your Step 1 plan was to provide a final answer.**
* In your **Step 1 Think block**, you must have already synthesized all information and planned the content of your response.
* Formulate the **comprehensive, detailed, and user-facing final answer** based on that plan.
* Your final answer must be enclosed in `<answer>...</answer>` tags.
Here is the question:
"""

# The image prompt's system prompt is the text one with two changes: search's queries must not
# refer to the image, and the image search's signature follows search's.
IMAGE_SEARCH_TOOL = (
    '{"type": "function", "function": {"name": "web_image_to_image_search", "description": '
    '"**IMPORTANT: This tool can only be called once.** Searches for relevant images based on the '
    'original image using web search.", "parameters": {"type": "object", "properties": '
    '{"img_idx": {"type": "string", "description": "A placeholder parameter. The value must '
    'always be \'0\'."}}, "required": ["img_idx"]}}}')
EXECUTOR_IMAGE_SYSTEM = EXECUTOR_SYSTEM.replace(
    "clearly state the topic.", "clearly state the topic without referring to images.").replace(
        "\n</tools>", f"\n{IMAGE_SEARCH_TOOL}\n</tools>")

EXECUTOR_IMAGE_USER = """# Workflow and Output Format
You must follow these steps in order. In every conversation turn, you start from Step 1.

**Step 1: Think (Plan)**
* **This is the starting point for every turn.**
* Analyze the user's query and all available information (including previous observations) carefully.
* **Evaluate the query's difficulty and nature.** Determine if the question can be answered *directly* or if it *requires external information* (e.g., facts, real-time data).
* Formulate a plan. Your plan must decide on **one** of two courses of action:
    1.  **Call a tool:** If your evaluation shows you **need more information** (e.g., for complex, factual, or real-time questions).
    2.  **Provide a final answer:** If your evaluation shows you have **sufficient information** (e.g., for simple questions, or tasks that don't require external data).
* Your entire reasoning process must be enclosed in `<think>...</think>` tags.

**Step 2: Act (Tool Call)**
* **Execute this step ONLY if your Step 1 plan was to call a tool.**
* Call the **one single tool** decided upon in your plan.
* The tool call must be enclosed in `<tool_call>...</tool_call>` tags.
* **Important: If you call a tool, you must STOP and wait for the observation. Do NOT proceed to Step 4.**

**Step 3: Observe (Tool Output)**
* **You will only enter this step after a tool call.**
* You will receive the tool's output (observation).
* After receiving the output, you **MUST** go back to **Step 1 (Think)** to analyze the new information and decide the next step (e.g., call another tool or provide the final answer).

**Step 4: Answer (Final Response)**
* **Execute this step ONLY if your Step 1 plan was to provide a final answer.**
* In your **Step 1 Think block**, you must have already synthesized all information and planned the content of your response.
* Formulate the **clear, focused, and concise user-facing final answer** based on that plan.
* Your final answer must be enclosed in `<answer>...</answer>` tags.
Here is the question and image:
<image>"""

PLAN_GUIDE = "\nHere is a guide for your reference:\n{plan}\nBegin your answer:\n"
REVISED_PLAN = ("\nI have a revised plan for you to follow:\n{replan}\nPlease continue with this "
                "updated guidance:\n")
OMITTED = "... (Omitted part of the results returned by the tool)"
# Not the authors' (their run ends at a malformed turn); used with on_format_error="feedback".
FORMAT_FEEDBACK = ("Your last turn was not valid ({error}). Each turn must be <think>...</think> "
                   "followed by exactly one <tool_call>...</tool_call> or <answer>...</answer>.")


def tool_message(text: str) -> dict:
  """The tool response as the Qwen chat templates render a `tool` message (in a user turn)."""
  return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}


# ------------------------------------------------------------------------------------- planner

PLANNER_SYSTEM = """
You’re a planning assistant in a three-step loop:  

1. **Plan**: Given a goal and background info, output a clear action plan.  
2. **Evaluate**: Given an execution trace, decide if replanning is needed.  
3. **Replan (if needed)**: With new reference memories, provide a revised plan targeting unmet goals.  

Keep responses concise and action-focused.
"""

PLAN_PROMPT = """
You are a memory-based planning assistant assisting an agent by providing strategic guidance.

The agent has access to the following tools:
- `search`: perform text-based web queries to retrieve external information.

### [Relevant Skill]
The following skill document summarizes proven strategies and common pitfalls for this type of question. Use it as a high-level reference when constructing your plan:
{skill}

### [Relevant Memories]
Each memory indicates whether it was **correct** or **incorrect**, along with its workflow:
{memory}

### Your Task:
- First review the **Skill** document for proven procedure steps and known pitfalls.
- Then analyze the **Question** and compare it with both **correct strategies** and **incorrect patterns** in the memories.
- If the skill provides a relevant procedure, adapt its steps to the specific question while incorporating memory-based insights.
- If similar successful approaches exist in memories, adapt their core idea to guide the next steps.
- If the context resembles past failures or skill-documented pitfalls, highlight what to avoid and suggest corrective actions.
- Recommend **one clear, generalizable work plan or action strategy** that directly addresses the current situation and guides agents step-by-step on what to do.

### Output should:
1. Be clear and concise—no more than {words} words, and present your response as a step-by-step plan.
2. Each step in the plan must be atomic and actionable, specifying a single operation such as invoking a tool (e.g., `search` with precise query intent), performing logical inference, executing a calculation, cross-verifying facts, or synthesizing prior observations.
3. You must include relevant memories and skill analysis in the thinking process (<think>...</think>), but do not mention them in the final output.
4. Don't try to give the answer directly, but give a plan.
5. Prohibit the generation of content unrelated to the plan.
6. Your response must not contain any factual information.

Your output should only contain the guideline, with no additional explanations.

**[Question]** (Global Objective):
{question}
"""

NO_SKILL = "No skill available for this question type."

JUDGE_PROMPT = """
{trace}

Based on the sufficiency of the reasons and evidence, assess whether the agent needs to replan. Only in the following cases:
- Tool support is missing or unclear,
- Reasoning has gaps or assumptions,
- Answer doesn’t fully address the question,
- Any doubt exists on correctness or clarity.

Use `replan` over accepting borderline solutions. The internal thinking block (<think>..</think>) should be extremely concise.

Respond with exactly one word: "yes" to trigger replanning, "no" to accept the current solution.
"""

REPLAN_PROMPT = """
### Reflection and Replanning

In the last conversation, you indicated that reflect and replan needed to be performed. Now you need to perform them.

**The original question:** {question}
{memory}
**The only tool you can recommend is `search`.**

Your task is to:
- Analyze the memories and reference their useful strategies.
- Analyze the current workflow so far to understand what has been attempted and why it failed.
- Recommend a **clear, generalizable work plan or action strategy** that builds on existing work, avoids past mistakes, and addresses the remaining challenges.

### Critical Requirements:
- **Leverage all completed steps from the current workflow**. Do not repeat searches, queries, or reasoning already performed.
- **Identify the exact failure point** and propose the next logical step toward the goal.

### Output should:
1. Be clear and concise, no more than {words} words, and present your response as a step-by-step supplementary plan.
2. You must include **reflection** on the previous failure in the thinking process (<think>...</think>), but **do not mention them in the final output**.
3. Don't give the answer directly, but provide **a supplementary plan**.
4. Prohibit generating content unrelated to the plan.
5. Your response must not contain any factual information.

Your output should only contain the guideline, with no additional explanations.
"""


TRACE_WORDS = 512  # words of each tool output the authors' judge prompt shows


def truncate_words(text: str, max_words: int = TRACE_WORDS) -> str:
  """agent_serve.py `truncate_by_whitespace_words`: tool output as the judge reads it."""
  words = text.split()
  if len(words) <= max_words:
    return " ".join(words) if text.strip() else text
  return " ".join(words[:max_words] + [OMITTED])


def render_trace(question: str, turns, max_words: int = TRACE_WORDS) -> str:
  """The execution trace of agent_serve.py `/plan`: each assistant turn as a round, each tool
  response (cut to `max_words` words) after it. `turns`: dicts with 'text' and 'tool_output'
  (or None)."""
  trace = f"### Question: {question}\n"
  for j, turn in enumerate(turns, 1):
    trace += f"### Round {j}:\n#### Agent Reasoning and Tool Call:\n{turn['text']}\n"
    if turn.get("tool_output") is not None:
      trace += (f"#### Tool Call Return Results:\n"
                f"{truncate_words(turn['tool_output'], max_words)}\n")
  return trace


_ROUND = re.compile(r"### Round \d+:\n#### Agent Reasoning and Tool Call:\n(.*?)"
                    r"(?=\n#### Tool Call Return Results:\n|\n### Round \d+:\n|\Z)", re.DOTALL)


def numbered(steps: Sequence[str]) -> str:
  """Steps as the plans and workflow summaries write them: `1. ...`, one a line."""
  return "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))


def rule_workflow(turn_texts: Sequence[str]) -> str:
  """A workflow summary written by rule from a run's assistant turns: each search call and the
  answer, one numbered step a line (`search(" X records")`, `answer 'painter'`); the form the
  toy's Distiller is taught (toy.corpus), exact where a small model garbles names. Read by
  pattern, not tools.parse_turn: the answer keeps its leading space, as the toy copies it."""
  steps = []
  for text in turn_texts:  # textscan: linear where the regexes were quadratic (99x per 10x)
    call = textscan.first_in_line(text, '"query_list": [', "]")
    answer = textscan.between(text, "<answer>", "</answer>")
    if call is not None:
      steps.append(f"search({call})")
    elif answer:
      steps.append(f"answer '{answer[0]}'")
  return numbered(steps)


def trace_turns(trace: str) -> list[str]:
  """The assistant turns' texts of a `render_trace` trace (its tool outputs left out)."""
  return _ROUND.findall(trace)


def after_think(text: str) -> str:
  """mmsearch.py `extract_after_think`: the text after the last think tag."""
  close, open_ = text.rfind("</think>"), text.rfind("<think>")
  if close == open_ == -1:
    return text.replace("<|im_end|>", "").strip()
  start = close + len("</think>") if close > open_ else open_ + len("<think>")
  return text[start:].replace("<|im_end|>", "").strip()


# ----------------------------------------------------------------------------------- distiller

DISTILLER_SYSTEM = (
    "You are a skill synthesis and evolution expert in a memory-augmented agent system. "
    "Your job is to analyze batches of task execution memories and distill them into "
    "reusable, structured skill documents. Skills encode proven strategies and common "
    "pitfalls for specific task categories. Output valid JSON only.")

SKILL_SCHEMA = """{
  "operation": "synthesize | refine | create | skip",
  "skill": {
    "skill_name": "<category>_<modality>_strategy",
    "category": "<category>",
    "modality": "<modality>",
    "description": "One-sentence description of the skill",
    "procedure": [
      {"step": 1, "action": "Concrete action description", "purpose": "Why this step matters"}
    ],
    "pitfalls": ["Common mistake to avoid"],
    "win_rate": 0.0,
    "version": 1,
    "evidence_count": 0
  },
  "absorbed_ids": ["list of memory data_ids whose patterns are now captured in the skill"]
}"""

SKILL_SYNTHESIS = """Analyze the following batch of task memories from the "{category}" category ({modality} modality) and synthesize a reusable skill document.

[Memories]
{formatted_memories}

Requirements:
1. Identify common strategies in successful (correct) memories — what search patterns, reasoning steps, or tool usage led to correct answers.
2. Identify common failure modes in incorrect memories — what mistakes, wrong assumptions, or missing steps caused failures.
3. Synthesize a structured skill with clear, atomic procedure steps that generalize across these memories.
4. List specific pitfalls to avoid, grounded in observed failure cases.
5. Compute win_rate as the ratio of correct memories to total memories.
6. Set operation to "synthesize", version to 1, evidence_count to the number of memories.

Output a JSON object with this exact structure (no extra text before or after the JSON):
{skill_output_schema}"""

SKILL_EVOLUTION = """Given the current skill and a batch of new evidence memories, decide how to update the skill.

[Current Skill]
{current_skill}

[New Evidence Memories]
{formatted_memories}

Choose ONE operation:
- "refine": Failures expose a specific defect in the current procedure. Fix the defective steps and update pitfalls, but preserve steps validated by successes (conservative editing — do not break what works).
- "create": Memories reveal an effective strategy pattern NOT covered by the current skill. Create a new skill.
- "skip": New evidence is insufficient to justify changes. Keep the skill unchanged, only update win_rate and evidence_count.

Conservative editing principles:
- Successful memories define invariants — the procedure steps they validate must NOT be modified.
- Failed memories define modification targets — only change steps related to the failure cause.
- Never remove a pitfall that is still relevant.

Output a JSON object with this exact structure (no extra text before or after the JSON):
{skill_output_schema}"""

SUMMARY = """
You will be given a transcript of a multi-round agent interaction (including reasoning traces, tool calls, and tool results). Your goal is to abstractly summarize the sequence of actions the model performed across rounds.

Your Output Requirements:  
Summarize what the model was doing in each major step, focusing on **abstract action patterns** while **including the key query content** (e.g., search keywords or tool parameters) that drove each step. Format each step as:  
**action purpose** (input → output), where *input* includes representative queries or hypotheses (e.g., “search('Palace of Lost City location')”), and *output* describes the resulting insight or state change.

Output in numbered steps (1., 2., 3., …). Do not copy verbatim; provide high-level abstractions that preserve intent and critical query details.  

Output only the numbered step summary—no explanations, headings, or extra text. Keep it clear, concise, and ≤{words} words.

Now summarize the following multi-round interaction:
{trace}
"""
SUMMARY_WORDS = 300
SKILL_FIELDS = ("skill_name", "category", "modality", "description", "procedure", "pitfalls",
                "win_rate", "version", "evidence_count")  # of a stored skill, shown as its JSON

# --------------------------------------------------------------------------------------- compact

COMPACT_EXECUTOR = (
    "Answer the question by searching. Each turn: <think>...</think> then either one "
    '<tool_call>{"name": "search", "arguments": {"query_list": ["..."]}}</tool_call> '
    "(then wait for the results) or <answer>...</answer>.\nQuestion: ")
COMPACT_EXECUTOR_IMAGE = (
    "Answer the question about the image by searching. Each turn: <think>...</think> then "
    'either one <tool_call>{"name": "search", "arguments": {"query_list": ["..."]}}</tool_call> '
    'or, once only, <tool_call>{"name": "web_image_to_image_search", "arguments": {"img_idx": '
    '"0"}}</tool_call> (then wait for the results) or <answer>...</answer>.\nImage: <image>'
    "\nQuestion: ")
COMPACT_PLAN_GUIDE = "\nPlan:\n{plan}\n"
COMPACT_REVISED_PLAN = "\nRevised plan:\n{replan}\nContinue:\n"
COMPACT_PLANNER_SYSTEM = "You plan searches for an agent, judge its work, and replan."
COMPACT_PLAN = ("Skill: {skill}\nMemories: {memory}\nWrite a numbered search plan (at most "
                "{words} words, no facts, no answer) for:\n{question}")
COMPACT_NO_SKILL = "none"
COMPACT_JUDGE = "{trace}\nReplan? Reply yes or no."
COMPACT_REPLAN = ("Replan for: {question}{memory}\nList the remaining steps (at most {words} "
                  "words, no facts).")
COMPACT_SUMMARY = ("Summarise the run in numbered steps (each search's query, then the answer), "
                   "at most {words} words:\n{trace}")
COMPACT_TRACE_WORDS = 80  # words of each tool output the compact judge prompt shows
COMPACT_DISTILLER_SYSTEM = "You distil task memories into skill documents. Output JSON only."
COMPACT_SKILL_FIELDS = (
    '{"operation": ..., "skill": {"skill_name", "category", "modality", "description", '
    '"procedure": [{"step", "action", "purpose"}], "pitfalls", "win_rate", "version", '
    '"evidence_count"}, "absorbed_ids": [...]}')
COMPACT_SYNTHESIS = ("Memories ({category}, {modality}):\n{formatted_memories}\nSynthesize a "
                     "skill as JSON: {skill_output_schema}")
COMPACT_EVOLUTION = ("Skill: {current_skill}\nNew memories:\n{formatted_memories}\nRefine, "
                     "create or skip, as JSON: {skill_output_schema}")

# -------------------------------------------------------------------------------- prompt styles


@dataclasses.dataclass(frozen=True)
class PromptStyle:
  """Every prompt of one style (AgentConfig.prompts): the builders below read only this, so a
  style is its templates, never a branch on its name."""
  name: str
  executor: str  # the executor's opening, the question appended
  plan_guide: str  # {plan}: appended after the question when there is a plan
  revised_plan: str  # {replan}: the user message resuming a run
  planner_system: str
  plan: str  # {skill} {memory} {question} {words}
  no_skill: str  # the {skill} slot when the question type has none
  judge: str  # {trace}: the evaluate turn
  judge_trace_words: int  # words of each tool output that trace shows
  replan: str  # {question} {memory} {words}
  distiller_system: str
  skill_synthesis: str  # {category} {modality} {formatted_memories} {skill_output_schema}
  skill_evolution: str  # {current_skill} {formatted_memories} {skill_output_schema}
  skill_schema: str
  summary: str  # {trace} {words}: the workflow summary
  # the executor's opening for a question with an image (one `<image>` marker), the question
  # appended
  executor_image: str = ""
  caption: str = "- Image Caption: {caption}"  # after the plan prompt's question (see below)


AUTHORS = PromptStyle(
    "authors", EXECUTOR_SYSTEM + EXECUTOR_USER, PLAN_GUIDE, REVISED_PLAN, PLANNER_SYSTEM,
    PLAN_PROMPT, NO_SKILL, JUDGE_PROMPT, TRACE_WORDS, REPLAN_PROMPT, DISTILLER_SYSTEM,
    SKILL_SYNTHESIS, SKILL_EVOLUTION, SKILL_SCHEMA, SUMMARY,
    EXECUTOR_IMAGE_SYSTEM + EXECUTOR_IMAGE_USER)
COMPACT = PromptStyle(
    "compact", COMPACT_EXECUTOR, COMPACT_PLAN_GUIDE, COMPACT_REVISED_PLAN, COMPACT_PLANNER_SYSTEM,
    COMPACT_PLAN, COMPACT_NO_SKILL, COMPACT_JUDGE, COMPACT_TRACE_WORDS, COMPACT_REPLAN,
    COMPACT_DISTILLER_SYSTEM, COMPACT_SYNTHESIS, COMPACT_EVOLUTION, COMPACT_SKILL_FIELDS,
    COMPACT_SUMMARY, COMPACT_EXECUTOR_IMAGE, "Image: {caption}")
STYLES = {s.name: s for s in (AUTHORS, COMPACT)}


def prompt_style(style: str | PromptStyle) -> PromptStyle:
  """The style named (AgentConfig.prompts), or the style itself."""
  if isinstance(style, PromptStyle):
    return style
  if style not in STYLES:
    raise ValueError(f"prompt style {style!r} (AgentConfig.prompts) not in {tuple(STYLES)}")
  return STYLES[style]


def executor_messages(question: str, plan: str | None,
                      style: str | PromptStyle = AUTHORS, image: bool = False) -> list[dict]:
  """The executor's opening chat: one user message (the authors' put everything there). image:
  the question comes with an image, its one `<image>` marker in the style's image opening
  (markers in the question or plan are removed: the image is the only one)."""
  style = prompt_style(style)
  question = strip_markers(question) if image else question
  plan = strip_markers(plan) if image and plan is not None else plan
  text = (style.executor_image if image else style.executor) + question
  text += style.plan_guide.format(plan=plan) if plan is not None else ""
  return [{"role": "user", "content": text}]


def revised_plan_message(replan: str, style: str | PromptStyle = AUTHORS) -> dict:
  return {"role": "user", "content": prompt_style(style).revised_plan.format(replan=replan)}


def plan_messages(skill: str, memory: str, question: str, words: int,
                  style: str | PromptStyle = AUTHORS, caption: str | None = None) -> list[dict]:
  """[system, plan prompt]; skill and memory as `planner.context_slots` gives them (skill
  NO_SKILL when the question type has none: the style's own words for it). caption: the
  question's image caption, shown after the question as the memories show theirs
  (skills.render_memories). The authors' planner sees captions only in its memories; it never
  sees the pixels, so without its own caption it would plan blind to the image."""
  style = prompt_style(style)
  if caption is not None and caption.strip():
    question = f"{question}\n{style.caption.format(caption=caption.strip())}"
  user = style.plan.format(skill=style.no_skill if skill == NO_SKILL else skill, memory=memory,
                           question=question, words=words)
  return [{"role": "system", "content": style.planner_system}, {"role": "user", "content": user}]


def judge_message(question: str, turns, style: str | PromptStyle = AUTHORS) -> dict:
  """The evaluate turn's user message: the executor's trace, then the yes / no request."""
  style = prompt_style(style)
  trace = render_trace(question, turns, style.judge_trace_words)
  return {"role": "user", "content": style.judge.format(trace=trace)}


def replan_message(question: str, memory: str | None, words: int,
                   style: str | PromptStyle = AUTHORS) -> dict:
  """memory: rendered new memories (None: none shown)."""
  block = f"\n### [Relevant Memories]\n{memory.strip()}\n" if memory else ""
  return {"role": "user", "content": prompt_style(style).replan.format(
      question=question, memory=block, words=words)}


def skill_chat(category: str, modality: str, memories: str, current_skill: str | None,
               style: str | PromptStyle = AUTHORS) -> list[dict]:
  """The Distiller's (Writer's) chat from formatted memories (format_batch): synthesis without a
  current skill (its JSON text), evolution with one."""
  style = prompt_style(style)
  if current_skill is None:
    user = style.skill_synthesis.format(category=category, modality=modality,
                                        formatted_memories=memories,
                                        skill_output_schema=style.skill_schema)
  else:
    user = style.skill_evolution.format(current_skill=current_skill, formatted_memories=memories,
                                        skill_output_schema=style.skill_schema)
  return [{"role": "system", "content": style.distiller_system}, {"role": "user", "content": user}]


def skill_messages(bucket, batch: Sequence[Memory], current: Skill | None,
                   style: str | PromptStyle = AUTHORS) -> list[dict]:
  """`skill_chat` of a bucket's memories and its stored skill (shown as the JSON of its
  SKILL_FIELDS)."""
  bucket = as_bucket(bucket)
  doc = None if current is None else json.dumps(
      {k: v for k, v in current.to_dict().items() if k in SKILL_FIELDS}, ensure_ascii=False)
  return skill_chat(bucket.category, bucket.modality, format_batch(batch), doc, style)


def summary_messages(trace: str, style: str | PromptStyle = AUTHORS) -> list[dict]:
  """The Distiller's workflow summary of an execution trace (render_trace)."""
  return [{"role": "user", "content": prompt_style(style).summary.format(trace=trace,
                                                                         words=SUMMARY_WORDS)}]
