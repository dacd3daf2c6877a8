"""Step 3 of the protocol: one txid committed through every committer, in the order they
were added, on the commit thread.

A commit that raised may have been applied anyway (a reply lost to a timeout): before
treating it as a failure, the sink is asked which txid it holds
(``Committer.committed_txid``) and, if it holds this one, it is not committed again. It
never guesses. Opaque spouts are the exception: a replay may emit another batch, so only
a fresh commit of the attempt's own rows is exact and the sink's txid settles nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from transactional import contracts
from transactional.errors import ConfigurationError, LostLeadershipError
from transactional.faults import FaultPoint
from transactional.runtime.drivers import Checkpoint
from transactional.topology import CommitterNode
from transactional.types import CommitOutcome, TransactionAttempt

log = logging.getLogger("transactional.runner")

#: The fault points met before the first and the second committer writes.
_BEFORE = (FaultPoint.BEFORE_SINK_WRITE, FaultPoint.BETWEEN_COMMITTERS)


class CommitSequence:
    """Commits one txid at a time through ``committers``."""

    def __init__(
        self, committers: Sequence[CommitterNode], resolve_unknown: bool, checkpoint: Checkpoint
    ) -> None:
        self.committers = list(committers)
        self.resolve_unknown = resolve_unknown
        self.checkpoint = checkpoint
        #: Commits that raised but that the sink held: resolved by reading it, not redone.
        self.resolved = 0

    def commit(
        self, attempt: TransactionAttempt, number: int, prepared: Sequence[Any]
    ) -> list[CommitOutcome]:
        """Every committer commits ``attempt.txid``, atomically with the txid in its sink;
        raises what the first failing one raised (nothing after it is written)."""
        outcomes = []
        for i, (node, inputs) in enumerate(zip(self.committers, prepared, strict=True)):
            if i < len(_BEFORE):  # each point once per attempt: only the first gap is named
                self.checkpoint(_BEFORE[i], attempt, number)
            outcomes.append(self._commit_one(node, attempt, inputs))
        self.checkpoint(FaultPoint.AFTER_SINK_WRITE, attempt, number)
        return outcomes

    def _commit_one(
        self, node: CommitterNode, attempt: TransactionAttempt, prepared: Any
    ) -> CommitOutcome:
        committer = node.committer
        try:
            outcome = committer.commit(attempt, prepared)
        except (LostLeadershipError, ConfigurationError):
            raise  # step 7, or a refusal that every attempt would meet again
        except Exception as exc:
            if not self.resolve_unknown:
                raise
            return self._resolve(node, attempt, exc)
        who = contracts.component("committer", node.name, committer)
        return contracts.check_outcome(outcome, who, attempt.txid)

    def _resolve(
        self, node: CommitterNode, attempt: TransactionAttempt, exc: Exception
    ) -> CommitOutcome:
        """The commit raised: read what the sink holds rather than guess. A txid it holds
        is not committed again (its reply was lost, not its write)."""
        try:
            held = node.committer.committed_txid()
        except Exception as unreadable:
            log.warning(
                "commit outcome unknown committer=%s txid=%d error=%r; the sink cannot be "
                "read either (%r): replaying",
                node.name,
                attempt.txid,
                exc,
                unreadable,
            )
            raise exc from None
        if held is None or held < attempt.txid:
            raise exc
        self.resolved += 1
        log.warning(
            "commit raised but the sink holds the txid committer=%s txid=%d held=%d "
            "error=%r: not committing it again",
            node.name,
            attempt.txid,
            held,
            exc,
        )
        return CommitOutcome.SKIPPED
