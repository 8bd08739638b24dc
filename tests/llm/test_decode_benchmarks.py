"""The decode benchmarks run and report what they were asked for (tiny shapes: no timing is
checked, only that every case runs and the layout asked for is the one measured)."""

import pytest

from tests import tiny_models


def test_cpu_matmul_measures_every_case():
  from benchmarks import cpu_matmul

  got = cpu_matmul.measure(rows=4, k=16, n=24, layers=2)
  assert set(got) == {"f32", "bf16_out_bf16", "bf16_acc_f32", "bf16_scan_stacked",
                      "bf16_separate_arrays"}
  assert all(v > 0 for v in got.values()), got


@pytest.mark.parametrize("unstack", [True, False])
def test_decode_step_runs_the_layout_asked_for(tmp_path, unstack):
  from benchmarks import decode_step
  from morse_jax import llm

  tiny_models.save_hf_model("llama", str(tmp_path))
  model = llm.load(str(tmp_path))
  prompts = tiny_models.random_tokens(0, (2, 8)).tolist()
  got = decode_step.step_ms(model, prompts, new=4, repeats=1, unstack=unstack)
  assert got["fused_decode_layout"] is unstack
  assert got["step_ms"] == got["step_ms"]  # a number, not NaN
