"""The tweet topology: spout -> ``parse`` -> ``count``, committed by one ``sink``.

Counts and dead letters go through a single committer on purpose: one commit per txid
holds all of a batch's outputs, so the dead letters are exactly-once together with the
counts they were left out of.
"""

from __future__ import annotations

from examples.tweets.bolts import (
    DEAD_LETTERS,
    HASHTAGS,
    USERS,
    USERS_HASHTAGS,
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


def build_topology(spout: AnySpout, committer: Committer) -> Topology:
    """Wire ``spout`` and ``committer`` around the parse and count bolts. The committer
    must accept the inputs of ``SINK_INPUTS`` (see ``sinks.counter_tables``)."""
    return (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("parse", ParseTweets(), input="spout")
        .set_bolt("count", CountTags(), input="parse")
        .set_committer("sink", committer, inputs=SINK_INPUTS)
        .build()
    )
