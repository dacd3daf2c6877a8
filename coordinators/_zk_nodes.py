"""Which txid nodes exist under a topology in ZooKeeper (metadata, partition entries,
digests), kept by the store between its writes so that a write knows what to create and
what to delete without listing children. The store reads them afresh from the tree
whenever they may disagree with it: after taking the fence (an earlier leader may have
written) and after a write that failed (it may have applied)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from coordinators._zk import node

#: Chooses txids: the ones a write deletes.
Chosen = Callable[[int], bool]


@dataclass
class TxidNodes:
    #: Txids with a ``coordinator/meta`` node.
    metas: set[int]
    #: Each partition's txids with a ``partition/<p>`` node.
    partitions: dict[int, set[int]]
    #: Txids with a ``coordinator/digest`` node.
    digests: set[int]

    def add_parts(self, txid: int, parts: Iterable[int]) -> None:
        """``txid``'s nodes under ``parts`` were written."""
        for p in parts:
            self.partitions.setdefault(p, set()).add(txid)

    def delete(
        self, tx: Any, path: Callable[..., str], chosen: Chosen, digests: Chosen | None = None
    ) -> None:
        """Add to ``tx`` the deletion of the metadata and partition nodes of every
        ``chosen`` txid, and of the digest nodes of every txid ``digests`` chooses
        (default: ``chosen``); ``path`` makes a node's path from its parts under the
        topology."""
        digests = digests or chosen
        for t in sorted(filter(chosen, self.metas)):
            tx.delete(path("coordinator", "meta", node(t)))
        for p, txids in sorted(self.partitions.items()):
            for t in sorted(filter(chosen, txids)):
                tx.delete(path("partition", str(p), node(t)))
        for t in sorted(filter(digests, self.digests)):
            tx.delete(path("coordinator", "digest", node(t)))

    def forget(self, chosen: Chosen, digests: Chosen | None = None) -> None:
        """The deletions ``delete`` added (the same arguments) were committed."""
        digests = digests or chosen
        self.metas = {t for t in self.metas if not chosen(t)}
        for txids in self.partitions.values():
            txids.difference_update([t for t in txids if chosen(t)])
        self.digests = {t for t in self.digests if not digests(t)}
