"""The tweet topology: spout -> ``parse`` -> ``count``, committed by one ``sink``
(or, with ``--sink both``, by a ``redis`` and a ``delta`` committer in that order).

Counts and dead letters go through a single committer on purpose: one commit per txid
holds all of a batch's outputs, so the dead letters are exactly-once together with the
counts they were left out of.
"""

from __future__ import annotations

from collections.abc import Mapping

from examples.tweets.bolts import (
    DEAD_LETTERS,
    HASHTAGS,
    TWEET_IDS,
    USERS,
    USERS_HASHTAGS,
    CountIds,
    CountTags,
    ParseTweets,
)
from transactional.committer import Committer
from transactional.spout import AnySpout
from transactional.topology import Topology, TopologyBuilder

__all__ = ["SINK_INPUTS", "build_topology"]

#: The sink's inputs: committer input name -> stream.
SINK_INPUTS = {
    HASHTAGS: f"count:{HASHTAGS}",
    USERS: f"count:{USERS}",
    USERS_HASHTAGS: f"count:{USERS_HASHTAGS}",
    DEAD_LETTERS: f"parse:{DEAD_LETTERS}",
}


def build_topology(
    spout: AnySpout, committer: Committer | Mapping[str, Committer], record_ids: bool = False
) -> Topology:
    """Wire ``spout`` and ``committer`` around the parse and count bolts. The committer
    must accept the inputs of ``SINK_INPUTS`` (see ``sinks.counter_tables``), and with
    ``record_ids`` also ``tweet_ids``, from a bolt counting each tweet under its id.

    A mapping of committers (``--sink both``) gives each the whole of every batch, in
    the mapping's order, each under its own name; a single one is named ``sink``.
    """
    committers = committer if isinstance(committer, Mapping) else {"sink": committer}
    builder = (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("parse", ParseTweets(), input="spout")
        .set_bolt("count", CountTags(), input="parse")
    )
    inputs = dict(SINK_INPUTS)
    if record_ids:
        builder = builder.set_bolt("ids", CountIds(), input="parse")
        inputs[TWEET_IDS] = "ids"
    for name, each in committers.items():
        builder = builder.set_committer(name, each, inputs=inputs)
    return builder.build()
