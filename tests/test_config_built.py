"""Each config file builds the settings dataclasses its values say: the expected ones here are
the dataclasses' defaults plus the values the config files (and configs/morse/common.py's
variants, backbones and hardware presets) give explicitly, so moving a setting into a config
section cannot change a run."""

import dataclasses
import importlib
import os

import pytest

from apex_jax import experiment as apex_experiment
from apex_jax.agents import APEX_ROLES, AgentConfig
from apex_jax.memory import MemoryConfig
from apex_jax.training.stages import STAGE_ORDER, StageConfig
from apex_jax.training.ttrl import TtrlConfig
from morse_jax.config_sections import settings
from morse_jax.experiments import experiment
from morse_jax.llm.sampling import SamplingConfig
from morse_jax.lora.experts import LoraConfig
from morse_jax.lora.router import RouterConfig
from morse_jax.rl.train_step import StepConfig
from morse_jax.rl.trainer import RolloutConfig

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")

# configs/morse/common.py base(): the authors' adapters and router, B = M = 4, 1024 tokens.
LORA = LoraConfig(targets=("q", "v", "o"), last_n_layers=8, rank=8, alpha=16.0,
                  num_subtask_experts=4)
ROUTER = RouterConfig(dim=128, top_k=2, log_prob="plackett_luce", merge_experts="union",
                      max_resample=8, proto_l2=1e-4, orthogonality=0.05, diversity=0.02)
ROLLOUT = RolloutConfig(routes_per_node=4, group_size=4, max_new_tokens=1024,
                        sampling=SamplingConfig(temperature=1.0), share_prompts=True)
STEP = StepConfig(estimator="hgrpo", micro_batches=1, remat=False)  # the cpu preset


def fixed(lora, router, rollout):
  """The fixed mixture: one LoRA of rank r(1+K), no router, one route of B x M samples."""
  return (dataclasses.replace(lora, rank=lora.rank * (1 + router.top_k), num_subtask_experts=0),
          None, dataclasses.replace(rollout, routes_per_node=1,
                                    group_size=rollout.routes_per_node * rollout.group_size))


def single(rollout):
  return None, None, dataclasses.replace(rollout, routes_per_node=1,
                                         group_size=rollout.routes_per_node * rollout.group_size)


DEMO_ROUTER = dataclasses.replace(ROUTER, dim=32)
DEMO_ROLLOUT = dataclasses.replace(ROLLOUT, routes_per_node=2, group_size=4, max_new_tokens=160)
DEMO = (dataclasses.replace(LORA, last_n_layers=2), DEMO_ROUTER,
        dataclasses.replace(STEP, expert_lr=2e-3, router_lr=1e-3, epochs=2), DEMO_ROLLOUT)
SMOLLM2_ROLLOUT = dataclasses.replace(ROLLOUT, routes_per_node=2, group_size=2)
SMOLLM2_TRAIN_ROLLOUT = dataclasses.replace(SMOLLM2_ROLLOUT, group_size=4, max_new_tokens=128,
                                            sampling=SamplingConfig(temperature=0.7))
SMOLLM2_TRAIN_STEP = dataclasses.replace(STEP, expert_lr=4e-4, router_lr=3e-4, remat=True)

# (config file, its argument) -> (lora, router, step, rollout)
MORSE = {
    ("humaneval", None): (LORA, ROUTER, STEP, ROLLOUT),
    ("humaneval", "fixed_grpo,llama31_8b,gpu8"):
        (*fixed(LORA, ROUTER, ROLLOUT)[:2],
         dataclasses.replace(STEP, estimator="grpo", remat=True),
         fixed(LORA, ROUTER, ROLLOUT)[2]),
    ("humaneval", "single,smollm2_135m,tpu_v5e8"):
        (*single(ROLLOUT)[:2],
         dataclasses.replace(STEP, estimator="grpo", micro_batches=16, remat=True),
         single(ROLLOUT)[2]),
    ("humaneval", "macnet,qwen25_coder_15b,cpu"):  # a baseline: the bare backbone, as single
        (*single(ROLLOUT)[:2], dataclasses.replace(STEP, estimator="grpo"), single(ROLLOUT)[2]),
    ("humaneval_canonical", None):
        (*single(ROLLOUT)[:2], dataclasses.replace(STEP, estimator="grpo"), single(ROLLOUT)[2]),
    ("scicode", None): (LORA, ROUTER, STEP, ROLLOUT),
    ("scicode", "mole_grpo,qwen3_4b,gpu8"):
        (LORA, ROUTER, dataclasses.replace(STEP, estimator="grpo", remat=True), ROLLOUT),
    ("scicode_canonical", None):
        (*single(ROLLOUT)[:2], dataclasses.replace(STEP, estimator="grpo"), single(ROLLOUT)[2]),
    ("srdd", None): (LORA, ROUTER, STEP, ROLLOUT),
    ("demo_cpu", None): (*DEMO[:3], dataclasses.replace(DEMO[3], engine=True)),
    ("table2_cpu", None): DEMO,
    ("table2_baselines", None): (LORA, ROUTER, STEP, ROLLOUT),  # morse_base's, on HumanEval
    ("smollm2_cpu", None):
        (LORA, ROUTER, STEP, dataclasses.replace(SMOLLM2_ROLLOUT, max_new_tokens=256)),
    ("smollm2_train_cpu", None):
        (LORA, ROUTER, SMOLLM2_TRAIN_STEP, SMOLLM2_TRAIN_ROLLOUT),
    ("smollm2_train_cpu", "fixed_grpo"):
        (*fixed(LORA, ROUTER, SMOLLM2_TRAIN_ROLLOUT)[:2],
         dataclasses.replace(SMOLLM2_TRAIN_STEP, estimator="grpo"),
         fixed(LORA, ROUTER, SMOLLM2_TRAIN_ROLLOUT)[2]),
}


def config_files(system):
  names = {f[:-3] for f in os.listdir(os.path.join(CONFIGS, system)) if f.endswith(".py")}
  return names - {"__init__", "common"}


def test_every_config_file_is_checked():
  assert {name for name, _ in MORSE} == config_files("morse")
  assert {name for name, _ in APEX} == config_files("apex")


@pytest.mark.parametrize("name,arg", sorted(MORSE, key=str))
def test_a_morse_config_builds_its_dataclasses(name, arg):
  c = importlib.import_module(f"configs.morse.{name}").get_config(arg)
  router, train = experiment.router_config(c), experiment.train_config(c)
  got = (experiment.lora_config(c), router, train.step,
         experiment.rollout_config(train, router is not None))
  assert got == MORSE[name, arg]


N = 37  # inputs per phase: a phase given in epochs takes ceil(epochs * N / batch_size) steps


def steps(epochs, batch_size):
  return -(-epochs * N // batch_size)


APEX_LORA = LoraConfig(targets=("q", "v", "o"), rank=8, alpha=16.0, roles=APEX_ROLES,
                       num_subtask_experts=0)
DEMO_AGENTS = AgentConfig(max_turns=5, max_llm_calls=10, max_tool_tokens=512,
                          max_context_tokens=2048, topk=2, planner_max_new_tokens=96,
                          executor_max_new_tokens=80, distiller_max_new_tokens=400,
                          temperature=1.0, top_p=1.0, prompts="compact", replan_memories=False)
PAPER_AGENTS = AgentConfig(max_turns=10, max_llm_calls=20, max_tool_tokens=4096,
                           max_context_tokens=32768, topk=3, planner_max_new_tokens=8192,
                           executor_max_new_tokens=16384, distiller_max_new_tokens=2048,
                           temperature=1.0, top_p=1.0, prompts="authors", replan_memories=True)
DEMO_APEX = dict(
    lora=dataclasses.replace(APEX_LORA, last_n_layers=2),
    step=StepConfig(estimator="grpo", aggregation="token-mean", advantage_clip=5.0,
                    min_reward_std=5e-4, micro_batches=4),
    agents=DEMO_AGENTS,
    bank=MemoryConfig(k=2, k_replan=1, evolve_every=4, evolve_min_size=2, evolve_window=8),
    stages={"executor": (StageConfig("executor", 6, 4, 4, 1e-3, 1.0, 80), DEMO_AGENTS),
            "distiller": (StageConfig("distiller", 2, 2, 4, 1e-3, 1.0, 320), DEMO_AGENTS),
            "planner": (StageConfig("planner", 3, 4, 4, 1e-3, 1.0, 96), DEMO_AGENTS)},
    ttrl=(TtrlConfig(2, 4, 4, 1e-4, 1.0, 96, store="all"), DEMO_AGENTS))
# the procedure demo: workflow summaries by rule, its agents on the generation engine
RULE_AGENTS = dataclasses.replace(DEMO_AGENTS, summaries="rule", engine=True)
SMOLLM2_AGENTS = dataclasses.replace(DEMO_AGENTS, max_context_tokens=4096,
                                     executor_max_new_tokens=96)


def paper_phase(module, epochs, batch, group, response, context, micro_batches, **agents):
  return (StageConfig(module, steps(epochs, batch), batch, group, 1e-6, 1.0, response,
                      micro_batches),
          dataclasses.replace(PAPER_AGENTS, max_context_tokens=context, **agents))


PAPER = dict(
    lora=dataclasses.replace(APEX_LORA, last_n_layers=8),
    step=StepConfig(estimator="grpo", kl_coef=0.0, micro_batches=1, remat=True,
                    aggregation="seq-mean-token-mean", advantage_clip=0.0, min_reward_std=0.0),
    agents=PAPER_AGENTS, bank=MemoryConfig(),
    # micro-batches: one 32768-token row per data shard of the 4 x 2 mesh (four of 6144 tokens)
    stages={"executor": paper_phase("executor", 8, 128, 8, 16384, 32768, 256,
                                    max_tool_tokens=4096),
            "distiller": paper_phase("distiller", 8, 64, 8, 2048, 6144, 32),
            "planner": paper_phase("planner", 5, 48, 4, 8192, 32768, 64, max_tool_tokens=8192)},
    ttrl=(TtrlConfig(steps(1, 8), 8, 4, 2e-7, 1.0, 8192, micro_batches=8, store="best"),
          dataclasses.replace(PAPER_AGENTS, max_context_tokens=32768, max_tool_tokens=8192)))
APEX = {
    ("demo_cpu", None): DEMO_APEX,
    ("demo_procedures", None): dict(  # the demo's settings on a procedure world, TTRL "majority",
        # workflow summaries by rule, the Distiller shown 4 memories (the toy's skill batches),
        # 18 executor updates
        DEMO_APEX, agents=RULE_AGENTS,
        bank=dataclasses.replace(DEMO_APEX["bank"], evolve_window=4),
        stages={m: (dataclasses.replace(stage, steps=18) if m == "executor" else stage,
                    RULE_AGENTS) for m, (stage, _) in DEMO_APEX["stages"].items()},
        ttrl=(dataclasses.replace(DEMO_APEX["ttrl"][0], store="majority"), RULE_AGENTS)),
    ("demo_smollm2", None): dict(DEMO_APEX, agents=SMOLLM2_AGENTS,  # no stage, no TTRL
                                 stages=dict.fromkeys(STAGE_ORDER), ttrl=None),
    # the vision demo: no stage, no TTRL (each system's initial experts with its own bank)
    # workflow summaries by rule; the VL rows sample on the static VL sampler (no engine)
    ("demo_vision", None): dict(DEMO_APEX, agents=dataclasses.replace(DEMO_AGENTS, summaries="rule"),
                                stages=dict.fromkeys(STAGE_ORDER), ttrl=None),
    ("demo_vision", "tool,no_text_image"): dict(
        DEMO_APEX, agents=dataclasses.replace(DEMO_AGENTS, summaries="rule"),
        bank=dataclasses.replace(DEMO_APEX["bank"], text_image=False),
        stages=dict.fromkeys(STAGE_ORDER), ttrl=None),
    ("paper", None): PAPER,
    ("paper", "model=/m,judge=http://j:8002/v1,data=hotpotqa:/d,index=/i"): PAPER,
}
# the comparison systems run beside the whole procedure demo, its settings unchanged
APEX.update({("baselines", arg): APEX["demo_procedures", None] for arg in (None, "react,memento")})


@pytest.mark.parametrize("name,arg", sorted(APEX, key=str))
def test_an_apex_config_builds_its_dataclasses(name, arg):
  c = importlib.import_module(f"configs.apex.{name}").get_config(arg)
  want = APEX[name, arg]
  agents = settings(AgentConfig, c.agents, "agents")
  exp = type("Built", (), {"agents": agents})  # what agents_for reads
  assert apex_experiment.lora_config(c) == want["lora"]
  assert apex_experiment.train_config(c).step == want["step"]
  assert agents == want["agents"]
  assert settings(MemoryConfig, c.memory.bank, "memory.bank") == want["bank"]
  for module in STAGE_ORDER:
    s = settings(apex_experiment.StagePhase, c.stages[module], f"stages.{module}", module=module)
    got = None
    if s.runs:  # pipeline.stages leaves a stage of steps 0 out
      got = (s.stage(N), apex_experiment.agents_for(exp, s, f"stages.{module}"))
    assert got == want["stages"][module], module
  t, got = settings(apex_experiment.TtrlPhase, c.ttrl, "ttrl"), None
  if t.runs:
    got = t.ttrl(N), apex_experiment.agents_for(exp, t, "ttrl")
  assert got == want["ttrl"]
  assert (t.summarize, t.checkpoint_every) == (True, 1)


def test_the_procedure_demo_holds_out_the_questions_it_evaluates_on_every_seed_world():
  # pipeline.evaluate reads the first eval.questions held-out questions and silently reads
  # fewer when a world holds out fewer: each seed's world (seeds.seed_config) must hold 32
  from apex_jax.seeds import seed_config
  from configs.apex import demo_procedures

  c = demo_procedures.get_config()
  assert c.eval.questions == 32
  for seed in c.seeds:
    s = seed_config(c, seed)
    train, test, _ = apex_experiment.load_data(s)
    assert len(test) >= c.eval.questions, (s.data.world_seed, len(test))
    assert {e.category for e in train + test} == {"career", "property"}
