"""Step 3 of the protocol: one txid, or one commit group of consecutive txids, committed
through every committer, in the order they were added, on the commit thread (a group:
``Committer.commit_group``, one write per committer, marked with its last txid).

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
    """Commits one txid (or one group) at a time through ``committers``."""

    def __init__(
        self, committers: Sequence[CommitterNode], resolve_unknown: bool, checkpoint: Checkpoint
    ) -> None:
        self.committers = list(committers)
        self.resolve_unknown = resolve_unknown
        self.checkpoint = checkpoint
        #: Commits that raised but that the sink held: resolved by reading it, not redone.
        self.resolved = 0

    def commit(
        self, members: Sequence[tuple[TransactionAttempt, int]], prepared: Sequence[Sequence[Any]]
    ) -> list[CommitOutcome]:
        """Every committer commits the txids of ``members`` (one, or a group; with their
        attempt numbers), atomically with the last txid in its sink; ``prepared``: per
        member, per committer. Raises what the first failing committer raised (nothing
        after it is written). A fault point is met once per member, so a fault planned
        for any txid of a group fires."""
        attempts = [attempt for attempt, _ in members]
        outcomes = []
        for i, node in enumerate(self.committers):
            if i < len(_BEFORE):  # each point once per attempt: only the first gap is named
                for attempt, number in members:
                    self.checkpoint(_BEFORE[i], attempt, number)
            inputs = [given[i] for given in prepared]
            outcomes.append(self._commit_one(node, attempts, inputs))
        for attempt, number in members:
            self.checkpoint(FaultPoint.AFTER_SINK_WRITE, attempt, number)
        return outcomes

    def _commit_one(
        self, node: CommitterNode, attempts: Sequence[TransactionAttempt], prepared: Sequence[Any]
    ) -> CommitOutcome:
        committer = node.committer
        last = attempts[-1]
        try:
            if len(attempts) == 1:
                outcome = committer.commit(last, prepared[0])
            else:
                outcome = committer.commit_group(attempts, prepared)
        except (LostLeadershipError, ConfigurationError):
            raise  # step 7, or a refusal that every attempt would meet again
        except Exception as exc:
            if not self.resolve_unknown:
                raise
            return self._resolve(node, last, exc)
        who = contracts.component("committer", node.name, committer)
        return contracts.check_outcome(outcome, who, last.txid)

    def _resolve(
        self, node: CommitterNode, attempt: TransactionAttempt, exc: Exception
    ) -> CommitOutcome:
        """The commit raised: read what the sink holds rather than guess. A txid it holds
        is not committed again (its reply was lost, not its write). ``attempt`` is the
        last of its group: a group is written whole or not at all, marked with it."""
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
