"""A spout's stored identity does not depend on where its class is defined: the
ready-made sources keep the names stores have held since they were public, a user's
spout keeps the name it was first stored under by setting ``stored_name``, and messages
name classes where users import them from, not by the private module that defines
them."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from committers.delta import DeltaCommitter
from committers.redis import RedisCommitter
from coordinators.sqlite import SQLiteStateStore
from transactional.contracts import qualified
from transactional.errors import ConfigurationError
from transactional.spout import (
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    TransactionalSpout,
)
from transactional.store import TopologyIdentity
from transactional.testing import ListTransactionalSpout

SOURCES = (
    "transactional.sources.delta",
    "transactional.sources.files",
    "transactional.sources.kafka",
    "transactional.sources.redis_streams",
)
KINDS = (TransactionalSpout, PartitionedTransactionalSpout, OpaquePartitionedTransactionalSpout)


def public_spouts() -> list[tuple[str, type]]:
    found = []
    for package in SOURCES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, KINDS):
                found.append((package, value))
    return found


def test_every_ready_made_source_is_found() -> None:
    assert {cls.__name__ for _, cls in public_spouts()} == {
        "DeltaTableSpout",
        "FilesOpaqueSpout",
        "FilesPartitionedSpout",
        "FilesTransactionalSpout",
        "KafkaOpaqueSpout",
        "KafkaPartitionedSpout",
        "RedisStreamsOpaqueSpout",
        "RedisStreamsPartitionedSpout",
    }


@pytest.mark.parametrize(("package", "cls"), public_spouts(), ids=str)
def test_a_ready_made_source_is_stored_under_its_public_name(package: str, cls: type) -> None:
    """What stores hold today for each (the package it is imported from, then the class),
    though the class is defined in a private module of that package."""
    assert cls.__module__.startswith(f"{package}._")
    assert cls.stored_name == f"{package}.{cls.__name__}"  # type: ignore[attr-defined]


def test_a_file_source_identity_begins_with_its_stored_name(tmp_path: Path) -> None:
    from transactional.sources.files import FilesOpaqueSpout

    spout = FilesOpaqueSpout(tmp_path)
    where = tmp_path.resolve()
    assert spout.identity() == f"transactional.sources.files.FilesOpaqueSpout:jsonl:{where}"


class Mine(ListTransactionalSpout):
    pass


class Pinned(ListTransactionalSpout):
    stored_name = "mypackage.old_place.MySpout"


class UnderPinned(Pinned):
    pass


def test_a_user_spout_is_stored_under_where_it_is_defined_unless_it_says() -> None:
    assert Mine([], 1).identity() == f"{__name__}.Mine"
    assert Pinned([], 1).identity() == "mypackage.old_place.MySpout"
    # A subclass is a spout of its own, with a name of its own.
    assert UnderPinned([], 1).identity() == f"{__name__}.UnderPinned"


def test_a_moved_spout_class_goes_on_with_its_topology_by_its_stored_name(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    first = SQLiteStateStore(path)
    first.open("tweets")
    first.register(TopologyIdentity("mypackage.old_place.MySpout", "transactional"))
    first.close()

    moved = SQLiteStateStore(path)
    moved.open("tweets")
    with pytest.raises(ConfigurationError) as refused:
        moved.register(TopologyIdentity(Mine([], 1).identity(), "transactional"))
    assert "set its stored_name to the name stored" in str(refused.value)
    moved.register(TopologyIdentity(Pinned([], 1).identity(), "transactional"))
    moved.close()


@pytest.mark.parametrize(
    ("cls", "name"),
    [
        (RedisCommitter, "committers.redis.RedisCommitter"),
        (DeltaCommitter, "committers.delta.DeltaCommitter"),
        # A public module is named as it is, whatever re-exports the class.
        (ListTransactionalSpout, "transactional.testing.memory.ListTransactionalSpout"),
        (int, "int"),
        (Mine, f"{__name__}.Mine"),
    ],
)
def test_messages_name_a_class_where_it_is_imported_from(cls: type, name: str) -> None:
    assert qualified(cls) == name


def test_a_class_its_package_does_not_export_keeps_its_module() -> None:
    from committers.delta._target import DeltaTarget

    assert not hasattr(importlib.import_module("committers.delta"), "DeltaTarget")
    assert qualified(DeltaTarget) == "committers.delta._target.DeltaTarget"
