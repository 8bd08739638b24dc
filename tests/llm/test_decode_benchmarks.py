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


def test_engine_step_classifies_the_traced_ops_by_their_custom_call():
  from benchmarks import engine_step_cpu

  hlo = """
  ffi_call.7 = f32[4,1,9,64]{3,2,1,0} custom-call(a, b), custom_call_target="morse_paged_attention_f32", api_version=API_VERSION_TYPED_FFI
  %ffi_call.8 = f32[4,960]{1,0} custom-call(x, w), custom_call_target="morse_skinny_matmul_f32"
  ffi_call.9 = f32[4,49152]{1,0} custom-call(x, e), custom_call_target="morse_skinny_matmul_f32"
  add_fusion.3 = f32[4,576]{1,0} fusion(p, q), kind=kLoop
  """
  kinds = engine_step_cpu.op_kinds(hlo, vocab=49152)
  assert kinds == {"ffi_call.7": "attention", "ffi_call.8": "products", "ffi_call.9": "head"}
  op = lambda name, dur, module="jit_decode": {"ph": "X", "dur": dur, "name": name, "args": {
      "hlo_module": module, "hlo_op": name}}
  events = [op("ffi_call.7", 10.0), op("ffi_call.7", 5.0), op("ffi_call.8", 3.0),
            op("ffi_call.9", 7.0), op("add_fusion.3", 1.5), op("ffi_call.8", 99.0, "jit_prefill"),
            {"ph": "X", "dur": 500.0, "name": "$engine.py step"}]  # a Python frame: not an op
  assert engine_step_cpu.trace_split(events, kinds, "jit_decode") == {
      "attention": 15.0, "products": 3.0, "head": 7.0, "other": 1.5}
