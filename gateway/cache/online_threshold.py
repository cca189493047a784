"""Per-entry acceptance thresholds learned online (the "verified cache" idea).

Every cached entry starts at the shipped global threshold ``start`` (conservative). A lookup
whose best candidate scores in the *band* ``[floor, start)`` is a miss, but once the upstream
has answered, the outcome can be checked for free: would the cached answer have been right?
(``SemanticLayer`` compares the fresh answer with the cached one; an explicit client report or
a sampled shadow check of a hit gives the same kind of observation.) Each observation
``(score, correct)`` is recorded on the entry, and the entry lowers its own threshold only as
far as its own record justifies:

- the record is the entry's last ``keep`` band observations (a refutation is only forgotten
  when the record holds nothing else);
- for a candidate level ``t`` (one of the scores it saw confirmed), the observations scored
  ``>= t`` give ``ok`` right and ``bad`` wrong; with a Beta prior worth ``prior_weight``
  observations at the band's global precision (by default the level itself: the verifier's
  score is its estimate of P(same question); or a calibration table), the posterior mean error
  ``(b0 + bad) / (prior_weight + ok + bad)`` must be ``<= max_error`` and the level needs
  ``min_ok`` confirmations of its own;
- the entry's threshold is the lowest level that passes (never below ``floor``), else ``start``.

So an entry never accepts below ``start`` before ``min_ok`` confirmations, a wrong observation
counts against every level at or below its score (raising the threshold above it until enough
new confirmations outweigh it), and as observations accumulate the posterior concentrates on
the entry's true error rate, which bounds the error of its band answers by ``max_error`` in the
long run (``tests/test_semantic_online.py`` checks both; ``gateway.lab.semcache_stream``
measures it on streams of labelled pairs). A hit at or above ``start`` is unaffected: the
global threshold remains the floor of trust for an entry nobody has checked.

Pure Python, no I/O: the cache calls ``cut`` on each candidate and ``observe`` on feedback."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OnlinePolicy:
    start: float  # the global (shipped) threshold every entry starts at
    floor: float = 0.5  # an entry never accepts below this score
    max_error: float = 0.05  # the posterior mean error a lowered level may have
    # (level, global precision of the scores in [level, start)), ascending levels: the prior at
    # a level is that of the nearest point at or below it (conservative; 0 below the first);
    # empty: the level itself (the verifier's score is a probability)
    prior_table: tuple[tuple[float, float], ...] = ()
    prior_weight: float = 4.0  # the prior's worth in observations
    min_ok: int = 3  # confirmations a level needs of its own
    keep: int = 32  # observations kept per entry (most recent)

    def level(self, record: list[tuple[float, bool]]) -> float:
        """The lowest threshold the record justifies: ``start`` when no band level passes, and
        just above the highest refuted score when a hit at or above ``start`` was refuted."""
        if not record:
            return self.start
        ok = bad = 0
        best = self.start
        refuted_above = -1.0
        # walk the record from the top down (a wrong one first on ties); a level is a confirmed score
        for score, correct in sorted(record, key=lambda o: (-o[0], o[1])):
            ok += correct
            bad += not correct
            if score >= self.start:
                if not correct:
                    refuted_above = max(refuted_above, score)
                continue
            if not correct or score < self.floor or ok < self.min_ok:
                continue
            b0 = self.prior_weight * (1.0 - self.prior_at(score))
            if (b0 + bad) / (self.prior_weight + ok + bad) <= self.max_error + 1e-9:
                best = score
        if best >= self.start and refuted_above >= 0.0:
            return refuted_above + 1e-6
        return best

    def prior_at(self, level: float) -> float:
        """The global precision of band scores ``>= level`` before any record."""
        if not self.prior_table:
            return level
        found = 0.0  # below the table's first level
        for at, precision in self.prior_table:
            if at > level:
                break
            found = precision
        return found


@dataclass(slots=True)
class EntryRecord:
    """One entry's band observations and its current threshold."""

    threshold: float
    record: list[tuple[float, bool]] = field(default_factory=list)
    confirmed: int = 0
    refuted: int = 0

    def observe(self, policy: OnlinePolicy, score: float, correct: bool) -> None:
        if score < policy.floor:
            return  # nothing an entry would ever accept: says nothing about its band
        self.record.append((float(score), bool(correct)))
        if len(self.record) > policy.keep:  # forget the oldest confirmation, never a refutation
            oldest = next((i for i, (_, ok) in enumerate(self.record) if ok), None)
            if oldest is None:
                del self.record[0]
            else:
                del self.record[oldest]
        self.confirmed += correct
        self.refuted += not correct
        self.threshold = policy.level(self.record)
