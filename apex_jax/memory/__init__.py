"""APEx experience memory: instance memories and skill documents per category x modality bucket.

  bank = MemoryBank("memory.db", embedder)           # embedder: texts -> [n, d]
  bank.add(question, summary, correct, category="time")
  ctx = bank.planner_context(question)               # skill (if gamma > 0.1) + memories, as text
  bank.record_outcome(ctx.memory_ids, correct)       # after judgement
  if bank.due_for_evolution(ctx.bucket):
    batch = bank.evolution_batch(ctx.bucket)         # show format_batch(batch) to the Distiller
    bank.apply_distiller_reply(ctx.bucket, reply, batch=batch)

Modules: schema (names, config, SQLite migrations), records (dataclasses), store (MemoryBank),
retrieval (scores, numpy / faiss), evolution (skill methods of MemoryBank), skills (confidence,
Distiller replies, text), buckets (routing), exchange (JSON export / import).
"""

from apex_jax.memory.buckets import (CATEGORY_DESCRIPTIONS, CATEGORY_EXAMPLES, CentroidClassifier,
                                     LLMClassifier, modality_of, parse_category)
from apex_jax.memory.evolution import DistillerResult
from apex_jax.memory.records import (AddResult, Memory, NewMemory, OutcomeResult, PlannerContext,
                                     ProcedureStep, Retrieval, ScoredMemory, Skill)
from apex_jax.memory.schema import (CATEGORIES, DATABASE_CAUSES, MODALITIES, OUTCOMES,
                                    SCHEMA_VERSION, Bucket, MemoryBankDatabaseError,
                                    MemoryBankError, MemoryConfig)
from apex_jax.memory.skills import (ERROR_KINDS, OPERATIONS, DistillerError, confidence,
                                    extract_json_object, format_batch)
from apex_jax.memory.store import MemoryBank

__all__ = [
    "AddResult", "Bucket", "CATEGORIES", "CATEGORY_DESCRIPTIONS", "CATEGORY_EXAMPLES",
    "CentroidClassifier", "DATABASE_CAUSES", "DistillerError", "DistillerResult", "ERROR_KINDS",
    "LLMClassifier", "MODALITIES", "Memory", "MemoryBank", "MemoryBankDatabaseError",
    "MemoryBankError", "MemoryConfig", "NewMemory", "OPERATIONS", "OUTCOMES", "OutcomeResult",
    "PlannerContext", "ProcedureStep", "Retrieval", "SCHEMA_VERSION", "ScoredMemory", "Skill",
    "confidence", "extract_json_object", "format_batch", "modality_of", "parse_category",
]
