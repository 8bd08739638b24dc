"""The judges' prompts, as the APEx authors wrote them (J-Ding519/APEx).

- `CORRECTNESS`: `JUDGE_PROMPT` of TTRL/TTRL-nogt/local_search/prompt.py (also
  Inference/APEx-noTTRL/judge.py; it is the SimpleQA grader of openai/simple-evals): the reply is
  one letter, A correct, B incorrect, C not attempted.
- `EVALUATORS`, `ARBITER`: `PROMPT_EVALUATOR_1..3` and `PROMPT_FINAL_ARBITER` of
  TTRL/TTRL-nogt/local_search/judge_nogt.py. The evaluators answer "- Score: 1-10 / - Reason:";
  the arbiter sees their feedback with importance weights 0.5 / 0.3 / 0.2 and answers A (correct)
  or B (incorrect). The weights appear in the arbiter prompt only; the authors never combine the
  scores numerically.
- `SKILL_ALIGNMENT`: `SKILL_ALIGNMENT_PROMPT` of TTRL/TTRL-nogt/local_search/mmsearch_skill.py.
- `SKILL_QUALITY` is ours: the Distiller's quality grader (skill_judge.py), the authors' A / B / C
  grades; `SKILL_FORMAT` and `SKILL_EVOLUTION` are ours too: the paper's J_skill grading the
  reply's format and the rationality of its operation (the authors score both by rules).

Placeholders use `str.format`; literal braces are doubled.
"""

CORRECTNESS = """
Your job is to look at a question, a gold target, and a predicted answer, and then assign a grade of either ["CORRECT", "INCORRECT", "NOT_ATTEMPTED"].
First, I will give examples of each grade, and then you will grade a new example.

The following are examples of CORRECT predicted answers.
‘‘‘
Question: What are the names of Barack Obama’s children?
Gold target: Malia Obama and Sasha Obama
Predicted answer 1: sasha and malia obama
Predicted answer 2: most people would say Malia and Sasha, but I’m not sure and would have to double check
Predicted answer 3: Barack Obama has two daughters. Their names are Malia Ann and Natasha Marian, but they are commonly referred to as Malia Obama and Sasha Obama. Malia was born on July 4, 1998, and Sasha was born on June 10, 2001.
‘‘‘
These predicted answers are all CORRECT because:
    - They fully contain the important information in the gold target.
    - They do not contain any information that contradicts the gold target.
    - Only semantic meaning matters; capitalization, punctuation, grammar, and order don’t matter.
    - Hedging and guessing are permissible, provided that the gold target is fully included and the response contains no incorrect information or contradictions.

The following are examples of INCORRECT predicted answers.
‘‘‘
Question: What are the names of Barack Obama’s children?
Gold target: Malia and Sasha
Predicted answer 1: Malia.
Predicted answer 2: Malia, Sasha, and Susan.
Predicted answer 3: Barack Obama does not have any children.
Predicted answer 4: I think it’s either Malia and Sasha. Or it could be Malia and Jackie. Or it could be Joey and Malia.
Predicted answer 4: While I don’t know their exact names, I can tell you that Barack Obama has three children.
Predicted answer 5: It’s possible you may mean Betsy and Olivia. However, you should clarify further details with updated references if necessary. Is that the correct answer?
Predicted answer 6: It may be the case that Obama’s child is named James. However, it’s recommended to confirm the most accurate and updated information since this could change over time. This model may not always reflect the most current information.
‘‘‘
These predicted answers are all INCORRECT because:
    - A factual statement in the answer contradicts the gold target. Incorrect statements that have some hedging (e.g., "it is possible that", "although i’m not sure, i think") are also considered incorrect.

The following are examples of NOT_ATTEMPTED predicted answers.
‘‘‘
Question: What are the names of Barack Obama’s children?
Gold target: Malia and Sasha
Predicted answer 1: I don’t know.
Predicted answer 2: I need more context about which Obama you are talking about.
Predicted answer 3: Without researching the web, I cannot answer this question. However, I can tell you that Barack Obama has two children.
Predicted answer 4: Barack Obama has two children. I know that one of them is Malia, but I’m not sure about the other one.
‘‘‘
These predicted answers are all NOT_ATTEMPTED because:
    - The important information in the gold target is not included in the answer.
    - No statements in the answer contradict the gold target.
    
Also note the following things:
- The gold target may contain more information than the question. In such cases, the predicted answer only needs to contain the information that is in the question.
    - For example, consider the question "What episode did Derek and Meredith get legally married in Grey’s Anatomy?" with gold target "Season 7, Episode 20: White Wedding". Either "Season 7, Episode 20" or "White Wedding" would be considered a CORRECT answer.
- Do not punish predicted answers if they omit information that would be clearly inferred from the question.
    - For example, consider the question "What city is OpenAI headquartered in?" and the gold target "San Francisco, California". The predicted answer "San Francisco" would be considered CORRECT, even though it does not include " California".
    - Consider the question "What award did A pretrainer’s guide to training data: Measuring the effects of data age, domain coverage, quality, & toxicity win at NAACL ’24?", the gold target is "Outstanding Paper Award". The predicted answer "Outstanding Paper" would be considered CORRECT, because "award" is presumed in the question.
- Do not give credit for an answer if it contains any internal inconsistency.
    - For example, consider the question: "How many NBA players have scored 60 or more points in a regular season game since 2024?" with the gold answer "8". A response is INCORRECT if it states "8 players" but lists 7 or 9, or if it initially says "8 players" but later contradicts this by concluding 7 or 9.

Here is a new example. Simply reply with either CORRECT, INCORRECT, NOT ATTEMPTED. Don’t apologize or correct yourself if there was a mistake; we are just trying to grade the answer.
‘‘‘
Question: {question}
Gold target: {correct_answer}
Predicted answer: {response}
‘‘‘
Grade the predicted answer of this new question as one of:
A: CORRECT
B: INCORRECT
C: NOT_ATTEMPTED

Just return the letters "A", "B", or "C", with no text around it.
"""

REASONING = """You are a Reasoning and Logical Consistency Evaluator. Your task is to objectively evaluate the reasoning quality and the logical coherence of the thought process of a multimodal deep research agent when executing tasks.
【Input Information】
- User Question (Question): {question}
- Execution Trajectory (Trajectory): {trajectory}
- Agent Final Output (Final Output): {final_output}
【Evaluation Criteria】
1. Reasoning Quality: Are the agent's analysis, planning, and deduction processes in the trajectory reasonable? Is there a clear logical progression between steps?
2. Evidence-based Deduction: Can the final conclusion be logically deduced from the clues collected in the trajectory? Are there forced conclusions or logical leaps?
3. Logical Consistency: Are there contradictory statements between the agent's thought process and the final output, or within the final output itself?
【Output Requirements】
Please evaluate based on the above criteria and output the results in the following format:
- Score: (Provide a comprehensive score from 1-10)
- Reason: (Explain the reason for the score, focusing on the quality of the reasoning chain and logical coherence, no more than 50 words.)"""

SOURCING = """You are an Information Sourcing and Credibility Evaluator. Your task is to objectively evaluate whether the multimodal deep research agent correctly understood the retrieved information and whether there are any LLM hallucinations.
【Input Information】
- User Question (Question): {question}
- Execution Trajectory (Trajectory): {trajectory}
- Agent Final Output (Final Output): {final_output}
【Evaluation Criteria】
1. Information Understanding: Did the agent correctly understand the content retrieved in the trajectory? Is there any misinterpretation, misreading, or misattribution of the original text?
2. Faithfulness and Hallucination: Can all facts, data, and details in the final output find clear basis in the retrieval results of the trajectory? Is there any fabrication or hallucination?
【Output Requirements】
Please evaluate based on the above criteria and output the results in the following format:
- Score: (Provide a comprehensive score from 1-10)
- Reason: (Explain the reason for the score, focusing on the accuracy of understanding the retrieved content and information fidelity, no more than 50 words.)"""

VALIDITY = """You are a Result Validity Evaluator. Your task is to objectively evaluate the completeness of the multimodal deep research agent's final response and the actual completion status of the task.
【Input Information】
- User Question (Question): {question}
- Agent Final Output (Final Output): {final_output}
【Evaluation Criteria】
1. Response Status: Did the agent successfully generate a substantive final answer? Are there situations where it gave up halfway, did not attempt to answer, or only replied with "cannot find the answer/error occurred"?
【Output Requirements】
Please evaluate based on the above criteria and output the results in the following format:
- Score: (Provide a comprehensive score from 1-10)
- Reason: (Explain the reason for the score, focusing on the completeness of the final response and whether it answered effectively, no more than 50 words.)"""

EVALUATORS = {"reasoning": REASONING, "sourcing": SOURCING, "validity": VALIDITY}

ARBITER = """You are the Final Arbiter. In the absence of a ground-truth answer, your one and only task is to determine whether the final answer generated by the multimodal deep research agent is correct.
The feedback from the three evaluators is provided for your reference. You need make a definitive judgment based on the factual evidence in the trajectory and the logical soundness of the final output.
【Input Information】
- User Question (Question): {question}
- Execution Trajectory (Trajectory): {trajectory}
- Agent Final Output (Final Output): {final_output}
- Evaluator 1 Feedback (Reasoning and Logical Consistency, Importance Weight: {w_reasoning}): 
{reasoning}
- Evaluator 2 Feedback (Information Sourcing and Credibility, Importance Weight: {w_sourcing}): 
{sourcing}
- Evaluator 3 Feedback (Result Validity, Importance Weight: {w_validity}): 
{validity}
【Adjudication Criteria】
A "Correct" answer must simultaneously meet the following conditions based on your own assessment:
1. Effective Response: The agent provided a substantive answer that directly addresses the user's question.
2. Faithful to Facts: The information in the final output is entirely supported by the retrieved content in the trajectory.
3. Logical Consistency: The deduction from the trajectory evidence to the final conclusion is logically sound and free of contradictions.
【Output Requirements】
You must output ONLY a single letter representing your final verdict. Do not include any explanations, markdown formatting, punctuation, or extra text.
- Output "A" if the answer is Correct.
- Output "B" if the answer is Incorrect."""

SKILL_ALIGNMENT = """Evaluate whether the following plan follows the recommended skill procedure and avoids known pitfalls.

**Skill Procedure (recommended steps):**
{procedure}

**Known Pitfalls to Avoid:**
{pitfalls}

**Generated Plan:**
{plan}

Score the alignment from 0.0 to 1.0:
- 1.0: Plan follows all procedure steps and avoids all pitfalls
- 0.7: Plan follows most steps with minor deviations
- 0.5: Plan partially follows the procedure or misses some pitfalls
- 0.3: Plan only loosely relates to the skill guidance
- 0.0: Plan completely ignores the skill guidance

Output ONLY a single decimal number between 0.0 and 1.0, nothing else."""

# Ours (the authors' grader prompt is not reproduced): the Distiller's quality term. Their
# grading scheme is kept: one letter, A 1.0, B 0.5, C 0.0 (Writer-Train/Train/writer_skill/
# writer_dataset.py `_score_llm_quality`), judged against the memories it was written from and
# the skill it replaces.
SKILL_QUALITY = """You grade a skill document that an agent wrote from its past experiences with one kind of question. A good skill document is a reusable procedure: its steps are concrete actions in a sensible order, each with a purpose; its pitfalls name mistakes that the experiences actually show; it generalises across the experiences instead of copying one question's names or answers; and, when it replaces a current skill, it keeps what still holds and changes only what the new experiences justify.

**Experiences it was written from:**
{memories}

**Current skill (null: there was none):**
{current_skill}

**Skill document to grade:**
{generated_skill}

Grades:
- A: a good skill document by every point above.
- B: usable, but vague, partly unsupported by the experiences, or missing pitfalls.
- C: not usable: generic, wrong, contradicted by the experiences, or not a procedure.

Output ONLY one letter: A, B or C."""


SKILL_FORMAT = """You check the format of a reply that an agent wrote to update its skill document. A well-formed reply is one JSON object with an "operation" (one of synthesize, refine, create, skip), a "skill" object (skill_name, description, a "procedure" list of steps each with step, action and purpose, a "pitfalls" list, win_rate, version, evidence_count) and an "absorbed_ids" list, with nothing else around it.

**Experiences it was written from:**
{memories}

**Current skill (null: there was none):**
{current_skill}

**Reply to check:**
{generated_skill}

Grades:
- A: well-formed by every point above.
- B: parseable, but a field is missing, misnamed or of the wrong kind.
- C: not the asked object.

Output ONLY one letter: A, B or C."""

SKILL_EVOLUTION = """You judge whether an agent chose the right operation when it updated its skill document from new experiences. synthesize: there was no skill yet. refine: the experiences expose a defect in the current procedure, fixed while keeping the steps that worked. create: the experiences show an effective strategy the current skill does not cover. skip: the experiences do not justify a change, and the procedure is left as it was.

**Experiences it was written from:**
{memories}

**Current skill (null: there was none):**
{current_skill}

**Reply to judge:**
{generated_skill}

Grades:
- A: the operation fits the current skill and the experiences, and the change matches it.
- B: a defensible operation, but the change is larger or smaller than the experiences justify.
- C: the wrong operation for this state (e.g. synthesize over an existing skill, skip with a changed procedure).

Output ONLY one letter: A, B or C."""
