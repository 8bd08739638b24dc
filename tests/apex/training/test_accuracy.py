"""R_acc scorers (training/accuracy.py) and the skill-quality judge on scripted judge replies."""

import pytest

from apex_jax.judges import JudgeUnavailable, LlmJudge, SkillItem, SkillJudge
from apex_jax.training.accuracy import (AccuracyItem, JudgedAccuracy, RuleAccuracy, as_accuracy,
                                        rule_accuracy)
from tests.apex.judges.fakes import ScriptedChat

ITEMS = [AccuracyItem("Capital of France?", "Paris", ("Paris",)),
         AccuracyItem("Capital of Peru?", "the city of Lima", ("Lima",)),
         AccuracyItem("Capital of Chad?", None, ("N'Djamena",)),  # never answered
         AccuracyItem("Capital of Mali?", "  ", ("Bamako",))]  # blank


def test_rule_accuracy():
  assert RuleAccuracy("em").score_many(ITEMS) == [1.0, 0.0, 0.0, 0.0]
  assert RuleAccuracy("f1").score_many(ITEMS)[1] == pytest.approx(0.5)  # "city of lima" vs "lima"
  assert rule_accuracy("Paris", (), "em") == 0.0
  with pytest.raises(ValueError, match="RuleAccuracy.metric 'acc'"):
    RuleAccuracy("acc")
  with pytest.raises(ValueError, match="X.accuracy 'acc' not in"):
    as_accuracy("acc", "X")


def test_judged_accuracy_scores_falls_back_and_counts():
  def reply(prompt):
    if "Peru" in prompt:
      return "A"  # "the city of Lima": correct by the judge, EM 0
    return "I would say it is fine"  # France: unreadable -> EM fallback 1

  chat = ScriptedChat(reply)
  acc = JudgedAccuracy(LlmJudge(chat), fallback="em")
  assert acc.score_many(ITEMS) == [1.0, 1.0, 0.0, 0.0]
  assert chat.calls == [(2, 64, 0.0)]  # no answer / a blank one: 0 without a call
  assert acc.metrics == {"judge_calls": 2.0, "judge_fallbacks": 1.0}
  assert acc.judge.failures.snapshot()["unparseable"] == 1
  # a judge that is down: every answer scored by the fallback rule, counted; totals add up
  down = ScriptedChat(lambda prompt: JudgeUnavailable("connection refused"))
  acc.judge = LlmJudge(down)
  assert acc.score_many(ITEMS) == [1.0, 0.0, 0.0, 0.0]
  assert acc.metrics == {"judge_calls": 2.0, "judge_fallbacks": 2.0}
  assert dict(acc.totals) == {"judge_calls": 4, "judge_fallbacks": 3}
  # not attempted (C) and incorrect (B) score 0, judged (no fallback)
  acc = JudgedAccuracy(LlmJudge(ScriptedChat(lambda p: "C" if "France" in p else "B")), "f1")
  assert acc.score_many(ITEMS[:2]) == [0.0, 0.0] and acc.metrics["judge_fallbacks"] == 0.0
  with pytest.raises(ValueError, match="JudgedAccuracy.fallback 'x'"):
    JudgedAccuracy(acc.judge, fallback="x")


@pytest.mark.parametrize("reply, grade, failure", [
    ("A", 1.0, None), ("<think>weighing</think>**B**", 0.5, None), ("Grade: C", 0.0, None),
    ('{"grade": "A"}', 1.0, None), ("D", None, "unparseable"), ("<think>x</think>", None,
                                                               "empty_reply"),
    (JudgeUnavailable("down"), None, "unavailable")])
def test_skill_judge_replies(reply, grade, failure):
  judge = SkillJudge(ScriptedChat(lambda prompt: reply))
  assert judge.grade_many([SkillItem('{"operation": "skip"}', "memories")]) == [grade]
  counts = judge.failures.snapshot()
  assert sum(counts.values()) == (failure is not None) and (failure is None or counts[failure])
