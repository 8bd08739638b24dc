"""The three LLM judges on a scripted backend: prompts, batching, scores worked out by hand,
every failure kind counted with its defined score."""

import pytest

from apex_jax.judges import (AlignConfig, AlignJudge, Candidate, JudgeRequestError,
                             JudgeResponseError, JudgeUnavailable, LlmJudge, LlmJudgeConfig,
                             NoGtConfig, NoGtJudge, format_trajectory, has_guidance,
                             weighted_score)
from apex_jax.memory.records import ProcedureStep, Skill
from tests.apex.judges.fakes import ScriptedChat, by_role

# ------------------------------------------------------------------------------ correctness


def test_llm_judge_prompt_verdicts_and_batching():
  answers = {"w1": "A", "w2": "B", "w3": "C", "w4": '{"correct": true, "reason": "same"}'}
  chat = ScriptedChat(lambda text: answers[text.split("Predicted answer: ")[-1].split("\n")[0]])
  judge = LlmJudge(chat, LlmJudgeConfig(not_attempted_score=0.25))
  out = judge.judge_many([("q?", ["Paris", "paris fr"], p) for p in ("w1", "w2", "w3", "w4", " ")])
  assert [j.verdict for j in out] == ["correct", "incorrect", "not_attempted", "correct",
                                      "incorrect"]
  assert [j.score for j in out] == [1.0, 0.0, 0.25, 1.0, 0.0]
  assert out[3].reason == "same" and out[4].reason == "empty prediction"
  assert chat.calls == [(4, 64, 0.0)]  # one batched call; the empty prediction is never asked
  assert "Gold target: Paris OR paris fr\nPredicted answer: w1" in chat.prompts[0]
  assert judge.failures.total == 0


@pytest.mark.parametrize("reply, kind", [
    ("", "empty_reply"), ("<think>hmm</think>", "empty_reply"), ("I am not sure.", "unparseable"),
    (JudgeUnavailable("down"), "unavailable"), (JudgeRequestError("400"), "rejected"),
    (JudgeResponseError("no choices"), "bad_response")])
def test_llm_judge_failures_are_counted_and_scored(reply, kind):
  judge = LlmJudge(ScriptedChat(lambda text: reply), LlmJudgeConfig(failure_score=0.5))
  j = judge.judge("q?", "Paris", "Paris, France")
  assert (j.verdict, j.score, j.failure) == (None, 0.5, kind)
  assert judge.failures.snapshot()[kind] == 1 and judge.failures.total == 1


def test_llm_judge_substring_fallback_when_the_judge_is_down():
  judge = LlmJudge(ScriptedChat(lambda text: JudgeUnavailable("down")),
                   LlmJudgeConfig(on_unavailable="substring"))
  assert judge.judge("q?", "Paris", "It is paris, France.").score == 1.0
  assert judge.judge("q?", "Paris", "Lyon").score == 0.0
  assert judge.failures.snapshot()["unavailable"] == 2


def test_llm_judge_config_errors_name_the_field():
  with pytest.raises(ValueError, match="on_unavailable.*'guess'"):
    LlmJudgeConfig(on_unavailable="guess")
  with pytest.raises(ValueError, match="failure_score.*1.5"):
    LlmJudgeConfig(failure_score=1.5)
  with pytest.raises(ValueError, match="answers is empty"):
    LlmJudge(ScriptedChat(lambda t: "A")).judge("q", [], "x")

# ---------------------------------------------------------------------------------- no-GT


def test_weighted_score_by_hand():
  # 0.5*8 + 0.3*6 + 0.2*10 = 7.8 -> (7.8 - 1) / 9 = 0.7555...
  assert weighted_score([8, 6, 10], (0.5, 0.3, 0.2)) == pytest.approx(6.8 / 9)
  assert weighted_score([1, 1, 1], (0.5, 0.3, 0.2)) == 0.0
  assert weighted_score([10, 10, 10], (0.5, 0.3, 0.2)) == pytest.approx(1.0)


def test_nogt_group_batches_and_combines():
  arbiter = lambda text: "A" if "Final Output): w5" in text else "B"
  chat = ScriptedChat(by_role("- Score: 8\n- Reason: sound", '{"score": 6, "reason": "ok"}',
                              "10/10", arbiter))
  judge = NoGtJudge(chat)
  out = judge.judge_group("who?", [Candidate("w5", "t1"), Candidate("w6", "t2"),
                                   Candidate("w7")])
  assert chat.calls == [(9, 1000, 0.1), (3, 1000, 0.0)]  # 3G evaluators, then G arbiters
  assert [j.verdict for j in out] == ["correct", "incorrect", "incorrect"]
  assert [j.reward for j in out] == [1.0, 0.0, 0.0]  # reward = arbiter by default
  first = out[0]
  assert {k: e.score for k, e in first.evaluators.items()} == \
      {"reasoning": 8.0, "sourcing": 6.0, "validity": 10.0}
  assert first.evaluators["reasoning"].reason == "sound"
  assert first.weighted == pytest.approx(6.8 / 9)
  arbiter_prompt = chat.prompts[9]
  assert "Importance Weight: 0.5): \n- Score: 8\n- Reason: sound" in arbiter_prompt
  assert "Importance Weight: 0.3)" in arbiter_prompt and "Importance Weight: 0.2)" in arbiter_prompt
  validity_prompt = chat.prompts[2]
  assert "Trajectory" not in validity_prompt  # the validity evaluator sees no trajectory
  assert judge.evaluator_failures.total == judge.arbiter_failures.total == 0


def test_nogt_weighted_reward_and_custom_weights():
  chat = ScriptedChat(by_role("Score: 2", "Score: 4", "Score: 10", "B"))
  judge = NoGtJudge(chat, NoGtConfig(reward="weighted", weights=(0.2, 0.3, 0.5)))
  j = judge.judge("q", Candidate("w1"))
  assert j.reward == j.weighted == pytest.approx((0.4 + 1.2 + 5.0 - 1) / 9)
  assert j.arbiter == 0.0
  assert "Importance Weight: 0.2)" in chat.prompts[-1]


@pytest.mark.parametrize("reply, kind", [
    ("", "empty_reply"), ("looks fine to me", "no_score"), ("Score: 11", "score_out_of_range"),
    ("Score: 0", "score_out_of_range"), (JudgeUnavailable("down"), "unavailable"),
    (JudgeRequestError("too long"), "rejected")])
def test_nogt_evaluator_failures(reply, kind):
  judge = NoGtJudge(ScriptedChat(by_role(reply, "Score: 5", "Score: 5", "A")),
                    NoGtConfig(failed_evaluator_score=2.0))
  j = judge.judge("q", Candidate("w1"))
  assert j.evaluators["reasoning"].failure == kind
  assert j.evaluators["reasoning"].score == 2.0
  assert j.weighted == pytest.approx((0.5 * 2 + 0.3 * 5 + 0.2 * 5 - 1) / 9)
  assert judge.evaluator_failures.snapshot()[kind] == 1 and judge.evaluator_failures.total == 1
  assert j.verdict == "correct"  # the arbiter still judges


def test_nogt_failed_evaluator_feedback_reaches_the_arbiter():
  chat = ScriptedChat(by_role(JudgeUnavailable("down"), "Score: 5", "Score: 5", "A"))
  NoGtJudge(chat, NoGtConfig(failed_feedback="(evaluator failed)")).judge("q", Candidate("w1"))
  assert "Importance Weight: 0.5): \n(evaluator failed)\n" in chat.prompts[-1]


def test_nogt_clip_mode_keeps_a_clipped_score():
  judge = NoGtJudge(ScriptedChat(by_role("Score: 12", "Score: 5", "Score: 5", "A")),
                    NoGtConfig(out_of_range="clip"))
  j = judge.judge("q", Candidate("w1"))
  assert j.evaluators["reasoning"].score == 10.0 and j.evaluators["reasoning"].failure is None
  assert judge.evaluator_failures.snapshot()["score_clipped"] == 1


@pytest.mark.parametrize("reply, kind", [
    ("", "empty_reply"), ("It depends.", "unparseable_verdict"), ("A or B", "unparseable_verdict"),
    (JudgeUnavailable("down"), "unavailable"), (JudgeResponseError("bad"), "bad_response")])
def test_nogt_arbiter_failures(reply, kind):
  judge = NoGtJudge(ScriptedChat(by_role("Score: 5", "Score: 5", "Score: 5", reply)),
                    NoGtConfig(failed_arbiter_score=0.3))
  j = judge.judge("q", Candidate("w1"))
  assert (j.verdict, j.arbiter, j.reward, j.arbiter_failure) == (None, 0.3, 0.3, kind)
  assert judge.arbiter_failures.snapshot()[kind] == 1 and judge.arbiter_failures.total == 1


def test_nogt_authors_verdict_rule():
  # judge_nogt.py: "A" anywhere after dropping dots and spaces -> correct
  def run(reply):
    judge = NoGtJudge(ScriptedChat(by_role("Score: 5", "Score: 5", "Score: 5", reply)),
                      NoGtConfig(arbiter_parse="authors"))
    return judge.judge("q", Candidate("w1")).verdict
  assert run("A.") == "correct" and run("B") == "incorrect"
  assert run("B, that is all") == "correct"  # the authors' rule, kept as it is
  assert run("Error") == "incorrect"


def test_nogt_config_errors_name_the_field():
  with pytest.raises(ValueError, match="weights.*summing to 1.*0.5, 0.5, 0.5"):
    NoGtConfig(weights=(0.5, 0.5, 0.5))
  with pytest.raises(ValueError, match="reward.*'best'"):
    NoGtConfig(reward="best")
  with pytest.raises(ValueError, match="failed_evaluator_score.*0"):
    NoGtConfig(failed_evaluator_score=0)


def test_format_trajectory_as_the_authors():
  text = format_trajectory("q?", [
      {"role": "assistant", "content": "<think>t</think><tool_call>x</tool_call>"},
      {"role": "user", "content": [{"type": "text", "text": "a b c d e"}]},
      {"role": "assistant", "content": "<answer>y</answer>"}], max_words=3)
  assert text == ("### Question: q?\n### Round 1:\n#### Agent Reasoning and Tool Call:\n"
                  "<think>t</think><tool_call>x</tool_call>\n#### Tool Call Return Results:\n"
                  "a b c ... (Omitted part of the results returned by the tool)\n"
                  "### Round 2:\n#### Agent Reasoning and Tool Call:\n<answer>y</answer>\n")

# ---------------------------------------------------------------------------------- align

SKILL = Skill("factual", "text-only", "lookup", "find facts",
              (ProcedureStep(1, "search the entity", "ground it"), ProcedureStep(2, "verify", "")),
              ("trusting one source",), 1, 3, 5, "create")


def test_align_prompt_scores_and_skipped_skills():
  replies_by_plan = {"p1": "0.7", "p2": "Score: 0.4", "p3": "7/10", "p4": "about 1.3 overall"}
  chat = ScriptedChat(lambda text: replies_by_plan[text.split("**Generated Plan:**\n")[1][:2]])
  judge = AlignJudge(chat)
  dict_skill = {"procedure": [{"step": 1, "action": "search", "purpose": "x"}], "pitfalls": []}
  out = judge.score_many([("p1", SKILL), ("p2", dict_skill), ("p3", SKILL), ("p4", SKILL),
                          ("p5", None), ("p6", {"procedure": [], "pitfalls": []})])
  assert [a.score for a in out] == pytest.approx([0.7, 0.4, 0.7, 1.0, 0.0, 0.0])
  assert chat.calls == [(4, 16, 0.0)]
  assert "1. search the entity — ground it\n2. verify\n" in chat.prompts[0]
  assert "**Known Pitfalls to Avoid:**\n- trusting one source" in chat.prompts[0]
  assert "**Known Pitfalls to Avoid:**\n(no pitfalls recorded)" in chat.prompts[1]
  assert judge.failures.snapshot()["score_clipped"] == 1
  assert has_guidance(SKILL) and not has_guidance(None) and not has_guidance({"pitfalls": []})


@pytest.mark.parametrize("reply, kind", [
    ("", "empty_reply"), ("follows it well", "no_score"), ("0.3 or 0.5", "no_score"),
    (JudgeUnavailable("down"), "unavailable")])
def test_align_failures(reply, kind):
  judge = AlignJudge(ScriptedChat(lambda text: reply), AlignConfig(failure_score=0.1))
  a = judge.score("plan", SKILL)
  assert (a.score, a.failure) == (0.1, kind) and judge.failures.snapshot()[kind] == 1
