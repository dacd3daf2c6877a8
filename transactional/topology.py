"""The topology builder: wires one spout, bolts and committers, and refuses bad wiring
at build time with a message that says what to change."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from transactional.bolt import DEFAULT_STREAM, Bolt, route_problem
from transactional.committer import Committer
from transactional.contracts import component
from transactional.errors import ConfigurationError, TopologyValidationError
from transactional.spout import (
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    TransactionalSpout,
)
from transactional.types import SpoutKind

SPOUT = "spout"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def stream_id(ref: str) -> tuple[str, str]:
    """``"parse"`` -> ``("parse", "default")``; ``"parse:bad"`` -> ``("parse", "bad")``."""
    component, _, stream = ref.partition(":")
    return component, stream or DEFAULT_STREAM


@dataclass(frozen=True)
class BoltNode:
    name: str
    bolt: Bolt
    input: tuple[str, str]


@dataclass(frozen=True)
class CommitterNode:
    name: str
    committer: Committer
    inputs: Mapping[str, tuple[str, str]]


@dataclass(frozen=True)
class Topology:
    """A validated topology. ``bolts`` are in an order where every bolt comes after the
    component it reads; ``committers`` commit in the order they were added."""

    spout: (
        TransactionalSpout[Any]
        | PartitionedTransactionalSpout[Any]
        | OpaquePartitionedTransactionalSpout[Any]
    )
    bolts: tuple[BoltNode, ...]
    committers: tuple[CommitterNode, ...]

    @property
    def kind(self) -> SpoutKind:
        return self.spout.kind

    def preflight(self) -> None:
        """The spout's and each committer's ``preflight`` (their servers answer, their
        directories can be written), before Spark starts; the first that cannot is a
        ``ConfigurationError`` naming it and what to fix."""
        self.spout.preflight()
        for node in self.committers:
            try:
                node.committer.preflight()
            except ConfigurationError as exc:
                raise ConfigurationError(
                    f"committer {node.name!r} ({type(node.committer).__name__}): {exc}"
                ) from None


class TopologyBuilder:
    def __init__(self) -> None:
        self._spout: object | None = None
        self._bolts: dict[str, BoltNode] = {}
        self._committers: dict[str, CommitterNode] = {}

    def set_spout(self, spout: object) -> TopologyBuilder:
        """The topology's one source; its output stream is called ``"spout"``."""
        kinds = (
            TransactionalSpout,
            PartitionedTransactionalSpout,
            OpaquePartitionedTransactionalSpout,
        )
        if not isinstance(spout, kinds):
            raise TopologyValidationError(
                f"{type(spout).__name__} is not a spout: subclass TransactionalSpout, "
                "PartitionedTransactionalSpout or OpaquePartitionedTransactionalSpout"
            )
        if not hasattr(spout, "metadata_type"):
            raise TopologyValidationError(
                f"{type(spout).__name__} has no metadata_type: set it to the pydantic "
                "model of its batch metadata"
            )
        self._spout = spout
        return self

    def set_bolt(self, name: str, bolt: Bolt, input: str = SPOUT) -> TopologyBuilder:
        """Add ``bolt`` reading the stream ``input`` (``"spout"``, ``"bolt"`` or ``"bolt:stream"``)."""
        self._check_name(name)
        if not isinstance(bolt, Bolt):
            raise TopologyValidationError(f"bolt {name!r} is a {type(bolt).__name__}, not a Bolt")
        self._bolts[name] = BoltNode(name, bolt, stream_id(input))
        return self

    def set_committer(
        self, name: str, committer: Committer, inputs: str | Mapping[str, str]
    ) -> TopologyBuilder:
        """Add ``committer`` consuming ``inputs``: one stream, or a mapping from the names
        the committer knows (e.g. table names) to streams."""
        self._check_name(name)
        if not isinstance(committer, Committer):
            raise TopologyValidationError(
                f"committer {name!r} is a {type(committer).__name__}, not a Committer"
            )
        refs = {DEFAULT_STREAM: inputs} if isinstance(inputs, str) else dict(inputs)
        if not refs:
            raise TopologyValidationError(f"committer {name!r} has no inputs")
        self._committers[name] = CommitterNode(
            name, committer, {k: stream_id(v) for k, v in refs.items()}
        )
        return self

    def _check_name(self, name: str) -> None:
        if not _NAME.match(name) or name == SPOUT:
            raise TopologyValidationError(
                f"invalid component name {name!r}: use letters, digits, '_' or '-', not 'spout'"
            )
        if name in self._bolts or name in self._committers:
            raise TopologyValidationError(f"component name {name!r} is used twice")

    def build(self) -> Topology:
        spout: Any = self._spout
        if spout is None:
            raise TopologyValidationError("no spout: call set_spout() before build()")
        if not self._committers:
            raise TopologyValidationError(
                "no committer: a topology without one writes nothing; add set_committer()"
            )
        streams: dict[str, tuple[str, ...]] = {SPOUT: (DEFAULT_STREAM,)}
        streams.update({name: tuple(node.bolt.outputs) for name, node in self._bolts.items()})

        def check(owner: str, ref: tuple[str, str]) -> None:
            component, stream = ref
            if component not in streams:
                raise TopologyValidationError(
                    f"{owner} reads unknown component {component!r}; known: {sorted(streams)}"
                )
            if stream not in streams[component]:
                raise TopologyValidationError(
                    f"{owner} reads unknown stream {component}:{stream}; "
                    f"{component!r} declares {list(streams[component])}"
                )

        for node in self._bolts.values():
            check(f"bolt {node.name!r}", node.input)
            problem = route_problem(node.bolt) if getattr(node.bolt, "accounts", False) else None
            if problem is not None:
                raise TopologyValidationError(
                    f"{component('bolt', node.name, node.bolt)}: {problem}"
                )
        for cnode in self._committers.values():
            for ref in cnode.inputs.values():
                check(f"committer {cnode.name!r}", ref)
            wanted = cnode.committer.input_names()
            if wanted is not None and set(cnode.inputs) != set(wanted):
                raise TopologyValidationError(
                    f"{component('committer', cnode.name, cnode.committer)} reads "
                    f"inputs {sorted(wanted)} but is wired with {sorted(cnode.inputs)}: pass "
                    f"set_committer({cnode.name!r}, ..., inputs={{name: stream}}) with "
                    "exactly those names"
                )
        return Topology(spout, self._ordered_bolts(), tuple(self._committers.values()))

    def _ordered_bolts(self) -> tuple[BoltNode, ...]:
        ordered: list[BoltNode] = []
        state: dict[str, str] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == "done":
                return
            if state.get(name) == "visiting":
                cycle = " -> ".join([*path[path.index(name) :], name])
                raise TopologyValidationError(f"bolts form a cycle: {cycle}")
            state[name] = "visiting"
            node = self._bolts[name]
            if node.input[0] != SPOUT:
                visit(node.input[0], [*path, name])
            state[name] = "done"
            ordered.append(node)

        for name in self._bolts:
            visit(name, [])
        return tuple(ordered)
