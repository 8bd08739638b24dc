"""benchmarks.apex_demo_trace on the committed toy: it reads a bank without changing it and
counts what it prints."""

import pytest

from configs.apex import demo_procedures



def test_copied_word_reads_the_positive_memories_only():
  from benchmarks.apex_demo_trace import copied_word
  context = ('#### Positive Examples: 1. search(" Durzur girnos record") '
             '#### Negative Examples: 1. search(" Lunton fuslor record")')
  assert copied_word(context, '2. Search "Fisus girnos record".') is True
  assert copied_word(context, '2. Search "Fisus girnal record".') is False
  assert copied_word(context, '2. Search "Fisus fuslor record".') is False  # a negative's word
  assert copied_word(context, "2. Search one record of Fisus.") is None


@pytest.mark.slow  # the toy's episodes for 2 questions, twice
def test_the_trace_reads_the_bank_and_counts_its_answers(tmp_path, capsys):
  from apex_jax.memory.store import MemoryBank
  from benchmarks import apex_demo_trace
  from morse_jax.lora.embedders import BackboneMeanEmbedder
  from morse_jax import llm

  c = demo_procedures.get_config()
  model = llm.load(c.model.path)
  bank_file = str(tmp_path / "bank.db")
  MemoryBank(bank_file, BackboneMeanEmbedder(model.params.embed, model.tokenizer)).close()
  before = open(bank_file, "rb").read()
  right = apex_demo_trace.trace(c, bank_file, questions=2)
  out = capsys.readouterr().out
  assert set(right) == {True, False} and all(0 <= n <= 2 for n in right.values())
  assert out.count("=== memories=") == 4 and out.count("  plan:") == 4
  assert f"right with memories=True: {right[True]} of 2" in out
  assert "plans naming a record word: " in out
  assert open(bank_file, "rb").read() == before  # read from a copy


@pytest.mark.slow  # memory building on 2 questions, then their trace
def test_without_a_bank_memory_building_builds_one_with_rule_summaries(tmp_path, capsys):
  from apex_jax.memory.store import MemoryBank
  from benchmarks import apex_demo_trace
  from morse_jax.lora.embedders import BackboneMeanEmbedder

  c = demo_procedures.get_config()
  c.memory_build.update(questions=2, batch_size=2)
  c.agents.summaries = "rule"
  bank_file = str(tmp_path / "built.db")
  stats, model = apex_demo_trace.build_bank(c, bank_file)
  out = capsys.readouterr().out
  assert stats["episodes"] == 2 and out.count("memory [") == 2
  bank = MemoryBank(bank_file, BackboneMeanEmbedder(model.params.embed, model.tokenizer))
  from apex_jax.pipeline import memory_buckets
  stored = [m for b in memory_buckets(bank) for m in bank.memories(b)]
  assert len(stored) == 2
  # rule summaries: numbered search / answer steps, nothing else
  assert all(line.split(". ", 1)[1].startswith(("search(", "answer '"))
             for m in stored for line in m.workflow_summary.splitlines()), stored
