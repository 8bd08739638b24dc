"""apex_jax.baselines: the comparison systems' prompts (what each carries and what it must not),
ExpeL's AGREE / EDIT / ADD replies (parse, apply, fallback), Memento's balanced retrieval, and
each system's memory building and evaluation row on a tiny world with a scripted generator.

Words the tests look for are w-words: the tiny tokenizer knows only w0..w89 as whole words, so
a prompt decoded from its tokens keeps them (and turns every other word into <unk>)."""

import json
import os
import re
import types

import jax
import pytest

from apex_jax import experiment, pipeline, seeds
from apex_jax.agents import AgentConfig
from apex_jax.agents import baseline_prompts as prompts
from apex_jax.agents import prompts as apex_prompts
from apex_jax.baselines import SYSTEMS, Parts, expel, rows, run_system
from apex_jax.memory import MemoryBank, MemoryConfig
from apex_jax.tools import render_tool_call
from configs.apex import baselines as baselines_config
from tests.apex.agents import fakes
from tests.apex.memory.fakes import HashEmbedder, TableEmbedder
from tests.apex.test_experiment import scripted_pipeline, small_config, tiny_model  # noqa: F401

AGENTS = AgentConfig(max_turns=3, max_llm_calls=6, max_tool_tokens=64, max_context_tokens=4096,
                     topk=1, planner_max_new_tokens=16, executor_max_new_tokens=16,
                     distiller_max_new_tokens=32, temperature=0.0, prompts="compact")
RULE_ADD = json.dumps({"operation": "ADD", "rule_number": 0, "rule_content": "w60 w61"})


def _words(text: str) -> set[str]:
  return set(re.findall(r"\bw\d+\b", text))


def reply(module, prompt, call):
  """Plans "w30", never replans; the executor searches once then answers w7; rules: ADD."""
  if module == "distiller":
    return RULE_ADD
  if module == "planner":
    return "<think> w20 </think> w30" if prompt.count("<|assistant|>") == 1 else "no"
  if prompt.count("<|assistant|>") == 1:
    return f"<think> w9 </think> {render_tool_call(['w20 w21'])}"
  return "<think> w5 </think> <answer> w7 </answer>"


class Recorder(fakes.ScriptedGenerator):
  """The decoded prompt of every call, per module."""

  def __init__(self, reply_fn=reply):
    super().__init__(reply_fn)
    self.texts = {"planner": [], "executor": [], "distiller": []}
    real = self.reply
    self.reply = lambda m, p, c: (self.texts[m].append(p), real(m, p, c))[1]


def _bank(tmp_path, embedder=None, name="b"):
  return MemoryBank(str(tmp_path / f"{name}.db"), embedder or HashEmbedder(32),
                    config=MemoryConfig(alpha=1.0, beta=1.0, k=2))


# ------------------------------------------------------------------------------------- prompts

@pytest.mark.parametrize("style,line", [("authors", "Here is the question:\n"),
                                        ("compact", "Question: ")])
def test_rag_puts_the_trajectories_just_before_the_question_line(style, line):
  text = prompts.rag_messages("Who is w3?", "### Question: w11\nw61 w62", style)[0]["content"]
  base = apex_prompts.prompt_style(style).executor
  assert text.endswith(line + "Who is w3?")
  block = prompts.baseline_prompts(style).rag_memory.format(context="### Question: w11 w61 w62")
  assert text == base[:len(base) - len(line)] + block + line + "Who is w3?"
  if style == "authors":  # Inference/Trace/prompt.py: "tags.\n{mem_prompt}\nHere is the question"
    assert "tags.\n\nHere are some memorys for your reference:\n" in text


def test_the_rule_follows_the_question_and_no_rule_is_the_bare_executor_prompt():
  bare = apex_prompts.executor_messages("q w3", None, "authors")
  assert prompts.rule_messages("q w3", None, "authors") == bare
  text = prompts.rule_messages("q w3", "w60 w61", "authors")[0]["content"]
  assert text == bare[0]["content"] + ("\nHere is a rule for your reference:\nw60 w61\n"
                                       "Begin your answer:\n")


def test_memento_cases_show_judgement_question_and_plan_positives_first():
  class M:
    def __init__(self, q, plan, outcome):
      self.question, self.workflow_summary, self.outcome = q, plan, outcome

  text = prompts.render_cases([M("w11", "w31", "correct")], [M("w12", "w32", "incorrect"),
                                                             M("w13", "w33", "incorrect")])
  assert text.index("Positive Examples (Successful Strategies - 1)") < text.index(
      "Negative Examples (Failure Lessons - 2)")
  assert "- Judgement: correct\n- Question: w11\n- Plan: w31\n" in text
  assert text.index("w32") < text.index("w33")
  assert prompts.render_cases([], []).endswith("None found.")
  chat = prompts.memento_messages("w3", text, "authors")
  assert chat[0]["content"] == prompts.MEMENTO_SYSTEM
  assert "META-PLANNER" in chat[1]["content"] and text in chat[1]["content"]


def test_plan_only_plans_with_no_memory():
  chat = prompts.plan_only_messages("w3", 50, "authors")
  assert [m["role"] for m in chat] == ["user"]  # Plan-only.py sends its prompt alone
  text = chat[0]["content"]
  assert text.endswith("(Global Objective): \nw3\n") and "senior expert" in text
  assert "(0 retrieved experiences)" in text and "\nNone found.\n" in text
  # the compact style has no Plan-only prompt: APEx's own, no skill, no memory
  assert prompts.plan_only_messages("w3", 50, "compact") == apex_prompts.plan_messages(
      apex_prompts.NO_SKILL, "### Retrieved Relevant Memories:\nNone found.", "w3", 50,
      "compact")


def test_expel_shows_the_trace_as_the_right_trial_and_numbers_the_rules():
  ok = prompts.expel_messages("w3", "w40", True, ["w60", "w61"], "authors")[0]["content"]
  assert "SUCCESSFUL TRIAL:\nQuestion: w3\nTrace: w40\n\nFAILED TRIAL:\n\n" in ok
  assert "EXISTING RULES (retrieved from similar past questions):\n1: w60\n2: w61\n" in ok
  assert ok.endswith(prompts.EXPEL_REPLY)
  bad = prompts.expel_messages("w3", "w40", False, [], "compact")[0]["content"]
  assert "Success:\n\nFailure:\nQuestion: w3\nTrace: w40\nRules:\nNone" in bad


# --------------------------------------------------------------------------------------- ExpeL

@pytest.mark.parametrize("text,want", [
    ('{"operation": "AGREE", "rule_number": 2, "rule_content": ""}', ("AGREE", 2, "")),
    ('<think>x</think>{"operation": "edit", "rule_number": 1, "rule_content": " w9 "}',
     ("EDIT", 1, "w9")),
    ('{"operation": "ADD", "rule_number": 0, "rule_content": "w8"}', ("ADD", 0, "w8")),
])
def test_rule_replies_parse(text, want):
  assert expel.parse_rule_op(text, shown=2) == expel.RuleOp(*want)


@pytest.mark.parametrize("text,kind", [
    ("AGREE with rule 1", "no_json"),
    ('{"operation": "ADD", "rule_content": "w8"}', "missing_field"),
    ('{"operation": "MERGE", "rule_number": 1, "rule_content": "w8"}', "operation"),
    ('{"operation": "EDIT", "rule_number": 3, "rule_content": "w8"}', "rule_number"),
    ('{"operation": "AGREE", "rule_number": 0, "rule_content": ""}', "rule_number"),
    ('{"operation": "EDIT", "rule_number": true, "rule_content": "w8"}', "rule_number"),
    ('{"operation": "EDIT", "rule_number": "1", "rule_content": "w8"}', "rule_number"),
    ('{"operation": "ADD", "rule_number": 0, "rule_content": "  "}', "rule_content"),
    ('{"operation": "EDIT", "rule_number": 1, "rule_content": ["w8"]}', "rule_content"),
])
def test_bad_rule_replies_name_their_kind(text, kind):
  with pytest.raises(expel.RuleReplyError) as err:
    expel.parse_rule_op(text, shown=2)
  assert err.value.kind == kind and kind in expel.ERROR_KINDS


def test_agree_edit_add_change_the_bank_as_expel_does(tmp_path):
  bank = _bank(tmp_path)
  bank.add("w11 w12", "w60", True, category=expel.OTHERS)
  bank.add("w13 w14", "w61", False, category=expel.OTHERS)
  shown = expel.nearest(bank, "w11 w12", 3)
  assert [m.workflow_summary for m in shown] == ["w60", "w61"]  # most similar first
  apply = lambda op: expel.apply_rule_op(bank, expel.parse_rule_op(op, 2), shown,  # noqa: E731
                                         question="w11 w12", correct=False)
  assert apply('{"operation": "AGREE", "rule_number": 1, "rule_content": ""}') == "agreed"
  assert len(bank) == 2
  assert apply('{"operation": "EDIT", "rule_number": 2, "rule_content": "w62"}') == "edited"
  assert bank.get(shown[1].id).workflow_summary == "w62" and bank.get(shown[1].id).outcome == \
      "incorrect"
  # ADD keeps every rule: the same question again is a new memory, not a duplicate
  assert apply('{"operation": "ADD", "rule_number": 0, "rule_content": "w63"}') == "added"
  assert len(bank) == 3 and [m.workflow_summary for m in expel.nearest(bank, "w11 w12", 3)][
      :2] in (["w60", "w63"], ["w63", "w60"])
  assert not bank.set_summary(999, "w1")


def test_the_rule_call_sees_the_top3_rules_and_a_bad_reply_changes_nothing(tmp_path, caplog):
  bank = _bank(tmp_path)
  for i in range(4):
    bank.add(f"w1{i} w20", f"w6{i}", i % 2 == 0, category=expel.OTHERS)
  replies = iter(['{"operation": "EDIT", "rule_number": 1, "rule_content": "w70"}',
                  "not json", '{"operation": "ADD", "rule_number": 0, "rule_content": "w71"}'])
  gen = Recorder(lambda m, p, c: next(replies))
  book = expel.RuleBook(gen, AGENTS, bank)
  counts = book.update(["w10 w20", "w11 w20", "w12 w20"], ["w40", "w41", "w42"],
                       [True, False, True], rng=jax.random.PRNGKey(0))
  assert counts == {"agreed": 0, "edited": 1, "added": 1, "rule_errors": 1,
                    "rule_error_no_json": 1}
  assert gen.calls == [("distiller", 3)]  # one sampler call for the batch
  first = gen.texts["distiller"][0]
  assert len(_words(first) & {"w60", "w61", "w62", "w63"}) == 3  # the top 3 of 4 rules
  assert "w60" in first and "w40" in first
  assert sorted(m.workflow_summary for m in bank.memories((expel.OTHERS, "text-only"))) == [
      "w61", "w62", "w63", "w70", "w71"]  # rule 1 of the first (w60) edited; w71 added
  assert "not applied (no_json)" in caplog.text


# ------------------------------------------------------------------------------------- Memento

def test_memento_retrieval_is_cosine_alone_and_balanced(tmp_path):
  """Worked by hand: cosines with the query w10 are 1, 0.95, 0.6 (correct: w11-w13) and 0.9,
  0.7 (incorrect: w14, w15); w11 lost its 3 later uses (win rate 1/4). APEx's score (alpha 0.7
  on the min-max cosine, 0.3 on the win rate) would put w12 first (0.9125 > 0.775); cosine alone
  keeps w11 first."""
  cos = {"w10": [1, 0], "w11": [1, 0], "w12": [0.95, 0.31225], "w13": [0.6, 0.8],
         "w14": [0.9, 0.43589], "w15": [0.7, 0.71414]}  # w10 the query; w11-w13 correct
  apex_bank = types.SimpleNamespace(config=MemoryConfig(), embedder=TableEmbedder(cos))
  bank = rows.baseline_bank(types.SimpleNamespace(bank=apex_bank), "memento", str(tmp_path))
  ids = {q: bank.add(q, f"w3{q[-1]}", q <= "w13", category=expel.OTHERS).id for q in
         ("w11", "w12", "w13", "w14", "w15")}
  for _ in range(3):
    bank.record_outcome([ids["w11"]], False)
  gen = Recorder()
  run_system("memento", Parts(gen, fakes.FakeSearcher(), AGENTS, bank), ["w10"],
             rng=jax.random.PRNGKey(0))
  # k 2 of each outcome, each best first, the positives before the negatives: plans w31 w32
  # (correct), then w34 w35 (incorrect); w33 left out
  shown = re.findall(r"\bw3[1-5]\b", gen.texts["planner"][0])
  assert shown == ["w31", "w32", "w34", "w35"]
  assert gen.calls[0] == ("planner", 1)


# ------------------------------------------------------------------------------------- systems

@pytest.fixture
def filled(tmp_path):
  """A bank holding one correct trajectory-like memory (w61 w62) for question w11."""
  bank = _bank(tmp_path)
  bank.add("w11 w12", "w61 w62", True, category=expel.OTHERS)
  yield bank
  bank.close()


MEMORY = {"w61", "w62"}


@pytest.mark.parametrize("name", SYSTEMS)
def test_each_system_prompts_carry_what_they_should(name, filled):
  gen = Recorder()
  runs = run_system(name, Parts(gen, fakes.FakeSearcher(), AGENTS, filled), ["w11 w12"],
                    rng=jax.random.PRNGKey(0))
  first_exec = gen.texts["executor"][0]
  plan_prompt = gen.texts["planner"][0] if gen.texts["planner"] else ""
  planned = name in ("memento", "plan_only")
  assert bool(gen.texts["planner"]) == planned  # react, rag and expel have no planner
  assert ("w30" in _words(first_exec)) == planned  # the plan reaches the executor
  executor_memory = {"react": False, "rag": True, "expel": True, "memento": False,
                     "plan_only": False}[name]
  assert (MEMORY <= _words(first_exec)) == executor_memory, first_exec
  assert (MEMORY <= _words(plan_prompt)) == (name == "memento")
  assert runs[0].answer == "w7" and gen.texts["distiller"] == []
  if name in ("react", "plan_only"):
    assert runs[0].memory_text is None and runs[0].shown_ids == ()
  else:
    assert runs[0].shown_ids and MEMORY <= _words(runs[0].memory_text)


def test_a_memory_system_needs_its_bank_and_names_are_checked():
  with pytest.raises(ValueError, match="'rag' needs its memory bank"):
    run_system("rag", Parts(Recorder(), fakes.FakeSearcher(), AGENTS), ["w1"],
               rng=jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="'reflexion' not in"):
    run_system("reflexion", Parts(Recorder(), fakes.FakeSearcher(), AGENTS), ["w1"],
               rng=jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="'ragg' not in"):
    baselines_config.get_config("react,ragg")
  assert baselines_config.get_config(None).eval.baselines == SYSTEMS
  toy = baselines_config.get_config("react").model.path  # every row on the toy taught MIA's forms
  assert toy.endswith(os.path.join("assets", "toy_apex_mia"))
  assert os.path.isfile(os.path.join(toy, "model.safetensors"))
  assert baselines_config.get_config("memento, react").eval.baselines == ("memento", "react")


# ---------------------------------------------------------------------------------- end to end

@pytest.fixture
def exp(tiny_model, tmp_path):  # noqa: F811
  gen = Recorder()
  gen.experts = None
  return experiment.build(small_config(tmp_path), model=tiny_model, generator=gen,
                          embedder=HashEmbedder(64))


def test_every_system_builds_its_memory_and_gets_a_row(exp, tmp_path):
  got = rows.baseline_rows(exp, SYSTEMS, rng=jax.random.PRNGKey(0), workdir=str(tmp_path))
  assert list(got) == list(SYSTEMS)
  n = exp.config.memory_build.questions  # 4, every answer w7: all incorrect
  for name, row in got.items():
    assert {"em", "f1", "answered", "context_tokens", "memory_context_tokens",
            "f1_per_question"} <= set(row), name
    assert row["answered"] == 1.0 and row["em"] == 0.0 and row["context_tokens"] > 0
  for name in ("react", "plan_only"):
    assert got[name]["memory_context_tokens"] == 0 and got[name]["bank"]["memories"] == 0
    assert "memory_build" not in got[name]
  for name in ("rag", "memento", "expel"):
    assert got[name]["memory_build"]["episodes"] == n and got[name]["memory_build"]["correct"] == 0
    assert got[name]["bank"]["memories"] == n and got[name]["memory_context_tokens"] > 0
  assert got["expel"]["memory_build"]["added"] == n  # one ADD per episode, none deduplicated
  assert got["react"]["context_tokens"] < got["rag"]["context_tokens"]  # trajectories cost
  # the stored memories: rag the raw trajectory, memento the plan, expel the rule
  summaries = {}
  for name in ("rag", "memento", "expel"):
    with MemoryBank(got[name]["bank"]["path"], exp.bank.embedder) as bank:
      summaries[name] = {m.workflow_summary for m in bank.memories((expel.OTHERS, "text-only"))}
  assert all(s.startswith("### Question:") and "#### Tool Call Return Results:" in s
             for s in summaries["rag"])
  assert summaries["memento"] == {"w30"} and summaries["expel"] == {"w60 w61"}
  assert len(exp.bank) == 0  # APEx's own bank is not touched


def test_pipeline_run_adds_the_baseline_rows_after_the_table(tiny_model, tmp_path,  # noqa: F811
                                                              monkeypatch):
  scripted_pipeline(monkeypatch, tiny_model)  # test_experiment's reply: plan, search, answer
  c = small_config(tmp_path, untrained=False, ablations=("full",), baselines=("react", "expel"))
  for m in pipeline.STAGE_ORDER:
    c.stages[m].steps = 0
  c.ttrl.steps = 0
  results = pipeline.run(c)
  assert list(results["eval"]) == ["full", "react", "expel"]
  assert "eval_baselines" in results["seconds"]
  assert "react" in pipeline.ablation_table(results["eval"])
  bad = small_config(tmp_path / "bad", baselines=("reflexion",))
  with pytest.raises(ValueError, match="'reflexion' not in"):
    pipeline.run(bad)


def test_the_seeds_summary_orders_full_above_each_system_it_ran():
  from_rows = {s: {"full": {"em": 0.5, "f1": 0.5}, "react": {"em": 0.1, "f1": f1}}
               for s, f1 in ((0, 0.2), (1, 0.5))}
  orders = seeds.summarize(from_rows)["orders"]
  assert orders["full>react"] == {"f1_held_on": 1, "ties": 1, "seeds": 2}
  assert "full>rag" not in orders  # a system not run has no order
