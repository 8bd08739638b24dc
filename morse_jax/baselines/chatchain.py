"""ChatDev's ChatChain (github.com/OpenBMB/ChatDev, branch chatdev1.0) for one code function.

Each phase is one instructor -> assistant exchange: the assistant's role prompt (RoleConfig.json)
as the system message, the phase prompt (PhaseConfig.json) as the instructor's message; a phase
that concludes does so on a line starting with `<INFO>`. The chain (ChatChainConfig.json):

  DemandAnalysis       Chief Product Officer: the demand, concluded on `<INFO> ...`
  Coding               Programmer: the first code
  CodeCompleteAll      Programmer: while the code is unimplemented (a stub, a TODO, no entry
                       point), at most 5 tries (max_num_implement; the chain's cycleNum is 10)
  CodeReview x 3       Code Reviewer comments (`<INFO> Finished`: the loop ends), Programmer
                       modifies
  Test x 3             the code on the task's visible examples in our sandbox (passing ends the
                       loop); Programmer summarises the bugs (TestErrorSummary), then fixes them
                       (TestModification)

Left out, as they do not change the code of one Python function: LanguageChoose (Python), the
reflection that concludes a multi-turn phase (one turn each here), EnvironmentDoc and Manual.
Prompts follow ChatDev's wording, shortened to a function task (no files, no GUI). Calls per
task: 3 at least (demand, coding, a review that finishes at once, tests that pass), 19 at most.
"""

from __future__ import annotations

from morse_jax.baselines.flow import Ask, Flow, Task, fence
from morse_jax.execution import verifier

REVIEW_CYCLES, TEST_CYCLES, COMPLETE_TRIES = 3, 3, 5
FINISHED = "<INFO> Finished"

BACKGROUND = ("ChatDev is a software company powered by multiple intelligent agents, such as "
              "chief executive officer, chief human resources officer, chief product officer, "
              "chief technology officer, etc, with a multi-agent organizational structure and the "
              "mission of 'changing the digital world through programming'.")
ROLES = {
    "Chief Product Officer": (
        "You are responsible for all product-related matters in ChatDev. Usually includes "
        "product design, product strategy, product vision, product innovation, project "
        "management and product marketing."),
    "Programmer": (
        "You can write/create computer software or applications by providing a specific "
        "programming language to the computer. You have extensive computing and coding "
        "experience in many varieties of programming languages and platforms."),
    "Code Reviewer": (
        "You can help programmers to assess source codes for software troubleshooting, fix bugs "
        "to increase code quality and robustness, and offer proposals to improve the source "
        "codes."),
}
FORMAT = ("Output the complete function, with any imports it needs, in one ```python code block. "
          "Please note that the code should be fully functional. Ensure to implement all "
          "functions. No placeholders (such as 'pass' in Python).")
DESIGN = ('Task: "{task}".\nModality: "a Python function".\nProgramming Language: "Python"\n')


def _ideas(ideas: str) -> str:
  return f'Ideas: "{ideas}"\n' if ideas else ""


def system(role: str, task: str) -> str:
  return (f"{BACKGROUND}\nYou are {role}. we are both working at ChatDev. We share a common "
          "interest in collaborating to successfully complete a task assigned by a new "
          f"customer.\n{ROLES[role]}\nHere is a new customer's task: {task}.\nTo complete the "
          "task, you must write a response that appropriately solves the requested instruction "
          "based on your expertise and customer's needs.")


def ask(phase: str, role: str, task: str, prompt: str) -> Ask:
  return Ask(phase, [{"role": "system", "content": system(role, task)},
                     {"role": "user", "content": prompt}])


def demand_prompt() -> str:
  return ("ChatDev has made products in many forms before; this customer's product is one Python "
          "function, whose signature and docstring are the task. As the Chief Product Officer, "
          "to satisfy the new user's demand, you should decide what the function must do: its "
          "inputs, its output and the cases it must handle. Note that we must ONLY discuss the "
          "demand and do not discuss anything else! Conclude by replying with one line, which "
          "starts with a single word <INFO>, followed by our final summary of the demand, e.g. "
          "\"<INFO> return the sum of the even numbers of the list, 0 for an empty list\".")


def coding_prompt(task: str, ideas: str) -> str:
  return ("According to the new user's task and our software designs listed below:\n"
          + DESIGN.format(task=task) + _ideas(ideas) +
          "We have decided to complete the task through one Python function. As the Programmer, "
          "to satisfy the new user's demands, you should write the function and make sure that "
          "every detail is, in the end, implemented as code.\nThink step by step and reason "
          "yourself to the right decisions to make sure we get it right.\n" + FORMAT)


def complete_prompt(task: str, code: str, missing: str) -> str:
  return ("According to the new user's task and our software designs listed below:\n"
          + DESIGN.format(task=task) + f'Codes:\n"{fence(code)}"\nUnimplemented: "{missing}"\n'
          "As the Programmer, to satisfy the complete function of our developed software, you "
          "have to implement all of the function. Now, implement it and all other code needed, "
          "then output the fully implemented code, strictly following the required format.\n"
          + FORMAT)


def review_prompt(task: str, ideas: str, code: str) -> str:
  return ("According to the new user's task and our software designs:\n" + DESIGN.format(task=task)
          + _ideas(ideas) + f'Codes:\n"{fence(code)}"\n'
          "As the Code Reviewer, to make the software directly operable without further coding, "
          "ChatDev have formulated the following regulations:\n1) all referenced classes should "
          "be imported;\n2) all methods should be implemented;\n3) no potential bugs;\n4) the "
          "code conforms to the task proposed by the user;\n5) most importantly, do not only "
          "check the errors in the code, but also the logic of code.\nNow, you should check the "
          "above regulations one by one and review the codes in detail, propose one comment with "
          "the highest priority about the codes, and give me instructions on how to fix. If the "
          "codes are perfect and you have no comment on them, return only one line like "
          f'"{FINISHED}".')


def modification_prompt(task: str, ideas: str, code: str, comments: str) -> str:
  return ("According to the new user's task, our designed product modality, languages and ideas, "
          "our developed first-edition source codes are listed below:\n" + DESIGN.format(task=task)
          + _ideas(ideas) + f'Codes:\n"{fence(code) if code else ""}"\n'
          f'Comments on Codes:\n"{comments}"\n'
          "As the Programmer, to satisfy the new user's demand and make the software executive "
          "and robust, you should modify corresponding codes according to the comments. Then, "
          "output the full and complete code with all bugs fixed based on the comments.\n" + FORMAT)


def error_summary_prompt(code: str, reports: str) -> str:
  return ('Our developed source codes and corresponding test reports are listed below:\n'
          f'Programming Language: "Python"\nSource Codes:\n"{fence(code)}"\n'
          f'Test Reports of Source Codes:\n"{reports}"\n'
          "According to my test reports, please locate and summarize the bugs that cause the "
          "problem.")


def test_modification_prompt(code: str, reports: str, summary: str) -> str:
  return ('Our developed source codes and corresponding test reports are listed below:\n'
          f'Programming Language: "Python"\nSource Codes:\n"{fence(code)}"\n'
          f'Test Reports of Source Codes:\n"{reports}"\nError Summary of Test Reports:\n'
          f'"{summary}"\nAs the Programmer, to satisfy the new user\'s demand and make the '
          "software execute smoothly and robustly, you should modify the codes based on the error "
          "summary. Output the code that you fixed.\n" + FORMAT)


def info(reply: str) -> str | None:
  """What follows the last `<INFO>` of a reply (a phase's conclusion); None without one."""
  return reply.rsplit("<INFO>", 1)[1].strip() if "<INFO>" in reply else None


def finished(reply: str) -> bool:
  return FINISHED.lower() in reply.lower()


def unimplemented(task: Task, code: str) -> str | None:
  """Why the code is not complete yet (CodeComplete's condition: ChatDev looks for a `pass`
  line), None when it is."""
  if not code.strip():
    return "there is no code yet"
  stub = verifier.placeholder(code)
  entry = task.entry_point
  if entry and not verifier.implements(code, entry):
    return stub or f"the function `{entry}` is not defined with a real body"
  return stub


def flow(task: Task) -> Flow:
  statement = task.problem.statement
  [reply] = yield [ask("DemandAnalysis", "Chief Product Officer", statement, demand_prompt())]
  ideas = info(reply)
  if ideas is None:  # ChatDev would reflect on the discussion; we keep the reply as the ideas
    task.fallback("DemandAnalysis", "no <INFO> conclusion; the reply is kept as the ideas")
    ideas = reply.strip()
  [reply] = yield [ask("Coding", "Programmer", statement, coding_prompt(statement, ideas))]
  code = task.revise("Coding", reply, "")
  for _ in range(COMPLETE_TRIES):
    missing = unimplemented(task, code)
    if missing is None:
      break
    [reply] = yield [ask("CodeComplete", "Programmer", statement,
                         complete_prompt(statement, code, missing))]
    code = task.revise("CodeComplete", reply, code)
  for _ in range(REVIEW_CYCLES):
    [comments] = yield [ask("CodeReviewComment", "Code Reviewer", statement,
                            review_prompt(statement, ideas, code))]
    if finished(comments):
      break
    [reply] = yield [ask("CodeReviewModification", "Programmer", statement,
                         modification_prompt(statement, ideas, code, comments))]
    if finished(reply) and task.code_of(reply) is None:
      break
    code = task.revise("CodeReviewModification", reply, code)
  for _ in range(TEST_CYCLES):
    passed, reports = task.test(code)
    if passed:
      break
    [summary] = yield [ask("TestErrorSummary", "Programmer", statement,
                           error_summary_prompt(code, reports))]
    [reply] = yield [ask("TestModification", "Programmer", statement,
                         test_modification_prompt(code, reports, summary))]
    code = task.revise("TestModification", reply, code)
  return fence(code) if code.strip() else reply
