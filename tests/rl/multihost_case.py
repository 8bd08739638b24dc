"""The multi-host test's workload, run in 1 process (8 devices) or 2 (4 each):
one HGRPO step on a fixed synthetic batch, and two `Trainer` steps (route draws, B x M sampling
over the mesh, rewards, update) on the token bandit.

`python -m tests.rl.multihost_case PROCESS_ID PORT [trainer]` joins a 2-process job (4 fake CPU
devices each) and prints the results as JSON on process 0.
"""

import json
import os
import sys

import numpy as np

ROWS, T, NODES, B = 16, 12, 2, 2


def numpy_batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 96, (ROWS, T)).astype(np.int32)
  attention = np.ones((ROWS, T), np.int32)
  loss_mask = np.zeros((ROWS, T), np.float32)
  loss_mask[:, 6:] = 1
  return dict(tokens=tokens, attention_mask=attention, loss_mask=loss_mask,
              logp_old=(-3.0 * loss_mask).astype(np.float32),
              rewards=rng.random(ROWS).astype(np.float32),
              route=(np.arange(ROWS) // (ROWS // (NODES * B))).astype(np.int32),
              valid=np.ones(ROWS, np.float32),
              idx=np.stack([np.zeros(ROWS), 2 + np.arange(ROWS) % 4, 2 + (np.arange(ROWS) + 1) % 4],
                           1).astype(np.int32),
              w=np.full((ROWS, 3), 1 / 3, np.float32))


def run_step(mesh, rows_of):
  """rows_of(array) -> the global row-sharded array for this process."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  from morse_jax import llm, lora
  from morse_jax.lora import mixture, router
  from morse_jax.rl import distributed
  from morse_jax.rl import train_step as ts
  from morse_jax.rl import update as update_lib

  config = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
  lcfg = lora.LoraConfig(last_n_layers=1, rank=4, alpha=8.0, num_subtask_experts=4)
  rcfg = router.RouterConfig(dim=8, top_k=2)
  replicate = lambda tree: jax.tree.map(
      lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec())), tree)
  backbone = replicate(llm.init_random(config, jax.random.key(0), scale=0.3))
  experts = jax.tree.map(lambda x: x + 0.05, lora.init_experts(lcfg, config, jax.random.key(1)))
  rparams = router.init_router(rcfg, 6, 4, jax.random.key(3))
  experts, rparams = replicate((experts, rparams))
  states = replicate(ts.init_opt_states(experts, rparams, ts.StepConfig()))
  b = numpy_batch()
  batch = ts.PolicyBatch(
      tokens=rows_of(b["tokens"]), attention_mask=rows_of(b["attention_mask"]),
      loss_mask=rows_of(b["loss_mask"]), logp_old=rows_of(b["logp_old"]),
      rewards=rows_of(b["rewards"]), route=rows_of(b["route"]), valid=rows_of(b["valid"]),
      routes=mixture.Routes(rows_of(b["idx"]), rows_of(b["w"])))
  emb = np.random.default_rng(1).normal(size=(NODES * B, 6)).astype(np.float32)
  rb = replicate(ts.RouterBatch(embeddings=emb, subtask_routes=np.asarray([[0, 1], [2, 3]] * 2),
                                mask=np.ones(NODES * B, np.float32)))
  update = update_lib.Update(config, lcfg, ts.StepConfig(), rcfg, routes_per_node=B)
  experts, rparams, _, metrics = update.step_fn(backbone, experts, rparams, states, batch, rb,
                                                update=update, num_routes=NODES * B)
  metrics, experts = distributed.to_host((metrics, experts))
  out = {k: float(v) for k, v in metrics.items()}
  out["expert_b_sum"] = float(np.abs(experts["q"].b).sum())
  return out


def run_trainer(mesh, steps: int = 2):
  """Metrics of `steps` Trainer steps (timings left out) and a checksum of the experts."""
  import jax

  from morse_jax import llm
  from morse_jax.llm import sharding
  from morse_jax.lora import router
  from morse_jax.rl import trainer as trainer_lib
  from morse_jax.rl import train_step as ts
  from morse_jax.tasks.token_bandit import TokenBandit
  from morse_jax import lora

  config = llm.LlmConfig("llama", vocab_size=96, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
  task = TokenBandit(vocab_size=96, categories=4, embed_dim=6, prompt_len=5)
  backbone = sharding.shard_params(llm.init_random(config, jax.random.key(0), scale=0.3), mesh)
  trainer = trainer_lib.Trainer(
      llm.Model(config, backbone),
      lora.LoraConfig(last_n_layers=1, rank=4, alpha=8.0, num_subtask_experts=4),
      router.RouterConfig(dim=8, top_k=2), ts.StepConfig(expert_lr=1e-2, router_lr=1e-2),
      trainer_lib.RolloutConfig(routes_per_node=2, group_size=2, max_new_tokens=6,
                                kernel="gather"), embed_dim=6, mesh=mesh)
  state = trainer.init_state(jax.random.key(7))
  history = []
  for cursor in range(0, 2 * steps, 2):
    state, metrics, _ = trainer.step(state, *task.batch(cursor, 2))
    history.append({k: float(v) for k, v in metrics.items() if np.ndim(v) == 0
                    and k not in trainer_lib.TIMING_KEYS})
  checksum = float(np.abs(sharding.to_host(state.experts)["q"].b).sum())
  return {"history": history, "expert_b_sum": checksum}


def main(process_id: int, port: int, trainer: bool):
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  import jax

  from morse_jax.llm import sharding
  from morse_jax.rl import distributed

  distributed.initialize(f"127.0.0.1:{port}", 2, process_id)
  assert jax.device_count() == 8 and jax.local_device_count() == 4
  mesh = sharding.make_mesh(8, 1)
  local = lambda x: x[process_id * ROWS // 2:(process_id + 1) * ROWS // 2]
  out = {"step": run_step(mesh, lambda x: distributed.global_rows(mesh, local(x)))}
  if trainer:
    out["trainer"] = run_trainer(mesh)
  if jax.process_index() == 0:
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["trainer"])
