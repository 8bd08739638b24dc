"""benchmarks.prompt_lookup's draft and verify count, on hand-made token lists."""

from benchmarks.prompt_lookup import draft, verifies


def test_draft_takes_the_latest_longest_match():
  assert draft([1, 2, 3, 9, 1, 2, 3, 7, 2, 3], 2, 3) == [7, 2]  # "2 3" last seen before 7
  assert draft([5, 1, 2, 6, 1, 2], 3, 2) == [6, 1, 2]
  assert draft([1, 2, 3], 2, 3) == []  # nothing repeats


def test_verifies_counts_passes():
  # a reply that copies its prompt: the first pass has no draft (8 occurs once), then each
  # pass emits its token and its 3 matching drafts: 1 | 2 3 4 5 | 6 7 8
  prompt, reply = [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]
  assert verifies(prompt, reply, 3, 1) == 3
  # nothing repeats: one token a pass
  assert verifies([10, 11], [20, 21, 22, 23], 5, 3) == 4
  # a wrong first guess emits one token and drafts nothing more
  assert verifies([1, 2, 1], [3, 4], 2, 1) == 2
