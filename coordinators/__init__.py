"""State stores behind ``transactional.store.StateStore``: SQLite (embedded, the
default) and ZooKeeper (several runners, several machines)."""

from coordinators.sqlite import SQLiteStateStore
from coordinators.zookeeper import ZooKeeperStateStore

__all__ = ["SQLiteStateStore", "ZooKeeperStateStore"]
