"""Skill documents and their evolution, as methods of MemoryBank (a mixin kept in its own file).

Evolution trigger (J-Ding519/APEx, Memory-Serve/memory_serve.py: SKILL_EVOLVE_THRESHOLD 5,
SKILL_BATCH_SIZE 15, bucket size >= 3): a bucket holding at least evolve_min_size memories is due
once evolve_every memories arrived after its last evolution (ids above `buckets.evolved_upto_id`:
a replacement counts as new, a dropped duplicate does not; the reference code counts every store
call and resets its counter even when the bucket was too small or the Writer failed, whereas here
the bucket stays due until a reply is applied or `mark_evolved` is called). The Distiller is
shown the bucket's last evolve_window memories; its reply is applied with `apply_distiller_reply`.
One skill per bucket: 'create' replaces it (as skill_repository.py does; Memory-Serve instead
keeps a second, complementary skill).

Skill evidence (win rate w = correct / evidence, n = evidence) comes from stored memories only:
synthesize / create start from the batch's outcomes (the reference code's synthesis prompt asks
the model for exactly that ratio; here the bank counts it), refine / skip add the memories new
since the last evolution.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

from apex_jax.memory import skills
from apex_jax.memory.records import Memory, Skill
from apex_jax.memory.schema import Bucket, as_bucket

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DistillerResult:
  applied: bool
  operation: str | None
  skill: Skill | None              # the bucket's stored skill afterwards
  error: skills.DistillerError | None = None
  unknown_absorbed_ids: int = 0    # absorbed ids outside the batch, dropped from an applied reply
  bucket_overwrites: int = 0       # skill category / modality fields naming another bucket,
                                   # overwritten with this bucket's in an applied reply


class SkillOps:
  """Skill and evolution methods of MemoryBank; they use its `_conn`, `_lock`, `_txn`,
  `config`, `counters`, `distiller_errors`, `unknown_absorbed_ids`, `bucket_overwrites`, `count`
  and `memories`."""

  def get_skill(self, bucket) -> Skill | None:
    with self._lock:
      return skills.load_skill(self._conn, as_bucket(bucket))

  def skill_history(self, bucket) -> list[Skill]:
    """Every version the bucket's skill has had, oldest first."""
    with self._lock:
      rows = self._conn.execute("SELECT doc FROM skill_history WHERE category = ? AND "
                                "modality = ? ORDER BY version", as_bucket(bucket)).fetchall()
    return [skills.skill_from_doc(r[0]) for r in rows]

  def skill_confidence(self, bucket) -> float:
    skill = self.get_skill(bucket)
    if skill is None:
      return 0.0
    return skills.confidence(skill.win_rate, skill.evidence_count, self.config.skill_evidence_n)

  def _evolved_upto(self, bucket: Bucket) -> int:
    row = self._conn.execute("SELECT evolved_upto_id FROM buckets WHERE category = ? AND "
                             "modality = ?", bucket).fetchone()
    return row[0] if row else 0

  def _new_evidence(self, bucket: Bucket) -> tuple[int, int]:
    """(memories, correct ones) of the bucket added since its last evolution."""
    n, good = self._conn.execute(
        "SELECT count(*), coalesce(sum(outcome = 'correct'), 0) FROM memories WHERE "
        "category = ? AND modality = ? AND id > ?",
        (*bucket, self._evolved_upto(bucket))).fetchone()
    return n, good

  def due_for_evolution(self, bucket) -> bool:
    """True when the bucket holds >= evolve_min_size memories and >= evolve_every of them
    arrived after its last evolution (replacements count as new, dropped ones do not)."""
    bucket = as_bucket(bucket)
    with self._lock:
      new, _ = self._new_evidence(bucket)
      return new >= self.config.evolve_every and self.count(bucket) >= self.config.evolve_min_size

  def evolution_batch(self, bucket) -> list[Memory]:
    """The bucket's last evolve_window memories, oldest first: what the Distiller is shown."""
    return self.memories(bucket, last=self.config.evolve_window)

  def mark_evolved(self, bucket) -> None:
    """Counts everything stored so far as distilled (e.g. after giving up on a bad reply)."""
    bucket = as_bucket(bucket)
    with self._txn(write=True) as conn:
      self._set_evolved(conn, bucket)

  def _set_evolved(self, conn, bucket: Bucket) -> None:
    top = conn.execute("SELECT coalesce(max(id), 0) FROM memories WHERE category = ? AND "
                       "modality = ?", bucket).fetchone()[0]
    conn.execute("INSERT OR REPLACE INTO buckets VALUES (?, ?, ?)", (*bucket, top))

  def apply_distiller_reply(self, bucket, reply: str, *, batch: Sequence[Memory] | None = None,
                            strict: bool = False) -> DistillerResult:
    """Applies the Distiller's JSON reply for `batch` (default: evolution_batch(bucket)).

    synthesize / create: a new skill document, version + 1, evidence = the batch's outcomes.
    refine: a new document, version + 1, evidence += memories new since the last evolution.
    skip: the document unchanged, evidence += the new memories.
    Any of them marks the bucket evolved. A bad reply changes nothing; it is counted in
    `distiller_errors[kind]`, logged, and returned as `error` (raised when strict).
    absorbed_ids that are not memories of `batch` are dropped and the reply is still applied
    (skills.py's module docstring says why); their number is added to `unknown_absorbed_ids`,
    logged, and returned as the result's `unknown_absorbed_ids`.
    A skill category / modality other than the bucket's is overwritten with the bucket's and the
    skill stored under `bucket`, as the authors' skill_repository.py does (skills.py's module
    docstring); the number of overwritten fields is added to `bucket_overwrites`, logged, and
    returned as the result's `bucket_overwrites`.
    """
    bucket = as_bucket(bucket)
    batch = list(self.evolution_batch(bucket) if batch is None else batch)
    ids = {str(m.id): m.id for m in batch}
    ids.update({m.data_id: m.id for m in batch if m.data_id})
    try:
      with self._txn(write=True) as conn:
        current = skills.load_skill(conn, bucket)
        op, fields, absorbed, dropped, overwritten = skills.parse_reply(reply, bucket, ids,
                                                                        current is not None)
        new_n, new_good = self._new_evidence(bucket)
        if op in ("synthesize", "create"):
          good, n = sum(m.correct for m in batch), len(batch)
        else:
          good = new_good + (current.correct_count if current else 0)
          n = new_n + (current.evidence_count if current else 0)
        if fields is not None:
          skill = Skill(*bucket, version=(current.version if current else 0) + 1,
                        correct_count=good, evidence_count=n, operation=op,
                        absorbed_ids=absorbed, **fields)
          skills.store_skill(conn, skill, new_version=True)
        elif current is not None:
          skill = dataclasses.replace(current, correct_count=good, evidence_count=n)
          skills.store_skill(conn, skill, new_version=False)
        else:
          skill = None
        self._set_evolved(conn, bucket)
    except skills.DistillerError as err:
      self.distiller_errors[err.kind] += 1
      log.warning("distiller reply for %s rejected (%s): %s", bucket, err.kind, err)
      if strict:
        raise
      return DistillerResult(False, None, self.get_skill(bucket), err)
    self.counters[f"distiller_{op}"] += 1
    if dropped:
      self.unknown_absorbed_ids += len(dropped)
      log.info("distiller reply for %s: dropped %d absorbed_ids not in the batch shown: %s",
               bucket, len(dropped), ", ".join(repr(d) for d in dropped))
    if overwritten:
      self.bucket_overwrites += len(overwritten)
      log.info("distiller reply for %s: skill %s named another bucket; stored under %s",
               bucket, " and ".join(overwritten), bucket)
    return DistillerResult(True, op, skill, unknown_absorbed_ids=len(dropped),
                           bucket_overwrites=len(overwritten))
