"""benchmarks.apex_demo_trace on the committed toy: it reads a bank without changing it and
counts what it prints."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # the toy's episodes for 2 questions, twice
def test_the_trace_reads_the_bank_and_counts_its_answers(tmp_path, capsys):
  from apex_jax.memory.store import MemoryBank
  from benchmarks import apex_demo_trace
  from morse_jax.lora.embedders import BackboneMeanEmbedder
  from morse_jax import llm

  c = apex_demo_trace._config(os.path.join(ROOT, "configs/apex/demo_procedures.py"), None)
  model = llm.load(c.model.path)
  bank_file = str(tmp_path / "bank.db")
  MemoryBank(bank_file, BackboneMeanEmbedder(model.params.embed, model.tokenizer)).close()
  before = open(bank_file, "rb").read()
  right = apex_demo_trace.trace(c, bank_file, questions=2)
  out = capsys.readouterr().out
  assert set(right) == {True, False} and all(0 <= n <= 2 for n in right.values())
  assert out.count("=== memories=") == 4 and out.count("  plan:") == 4
  assert f"right with memories=True: {right[True]} of 2" in out
  assert open(bank_file, "rb").read() == before  # read from a copy
