"""The keys a Redis committer writes and reads: its hashes, its dead-letter list and its
bookkeeping keys under a namespace, all behind one ``key_prefix``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["RedisKeys"]


@dataclass
class RedisKeys:
    """A committer's key naming. ``namespace`` is None until the committer opens (then
    ``default_namespace`` of its topology and name) unless it was given."""

    prefix: str
    #: The dead-letter list's key, the prefix included.
    dead_letters: str
    namespace: str | None = None

    def hash(self, table: str) -> str:
        """The key of counter table ``table``'s hash."""
        return self.prefix + table

    def key(self, suffix: str) -> str:
        """A bookkeeping key: ``<namespace>:<suffix>``."""
        return f"{self.namespace}:{suffix}"

    def default_namespace(self, topology_id: str, name: str) -> str:
        """``<prefix>transactional:<topology id>:<committer name>``."""
        return f"{self.prefix}transactional:{topology_id}:{name}"

    def of_commit(self, tables: Iterable[str]) -> dict[str, str]:
        """Every key a commit touches (what it is -> the key; a staging list stands for
        all of them: they differ only after the namespace)."""
        keys = {
            f"{s} key": self.key(s) for s in ("txid", "undo", "undo_dl", "mode", "fence", "ahead")
        }
        keys |= {"value types": self.key("value_types"), "staging": self.key("stage:0")}
        keys["dead letters list"] = self.dead_letters
        keys |= {f"hash of {name!r}": self.hash(name) for name in tables}
        return keys
