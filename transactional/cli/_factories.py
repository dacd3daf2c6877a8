"""A topology factory named on the command line (``module:function``): imported as
``python -m`` would, checked, and called."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from transactional.errors import ConfigurationError
from transactional.topology import Topology

__all__ = ["build_topology", "load_factory", "takes_spark", "topology_without_spark"]


def load_factory(spec: str) -> Any:
    """``module:function``, imported as ``python -m`` would: the current directory first."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"{spec!r}: give the topology factory as module:function")
    top = module_name.partition(".")[0]
    if top in sys.stdlib_module_names:
        raise ConfigurationError(
            f"the topology module {module_name!r} is named like Python's own module {top!r}, "
            f"which it would hide from everything imported after it: rename {top}.py"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # The module itself (or a package on its dotted path) is missing, not something
        # it imports: ``my_job`` importing a missing ``my`` is the module's own error.
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise ConfigurationError(
                f"cannot import the topology module {module_name!r}: not found from {cwd} "
                "or the installed packages; run from the directory that holds it, or install it"
            ) from exc
        raise ConfigurationError(
            f"the topology module {module_name!r} failed to import: {type(exc).__name__}: "
            f"{exc}; install what it imports"
        ) from exc
    except Exception as exc:
        raise ConfigurationError(
            f"the topology module {module_name!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        # Where it came from: a module named like an installed one is that one.
        origin = getattr(module, "__file__", None) or "a built-in module"
        raise ConfigurationError(
            f"{module_name!r} (imported from {origin}) has no function {attr!r}; the factory "
            "is module:function, returning a Topology"
        )
    return factory


def takes_spark(factory: Any, spec: str) -> bool:
    try:
        params = [
            p
            for p in inspect.signature(factory).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return False
    if len(params) > 1:
        raise ConfigurationError(
            f"topology factory {spec!r} takes {len(params)} arguments; it must take none "
            "(recommended) or one, the SparkSession"
        )
    return len(params) == 1


def build_topology(factory: Any, spec: str, *args: Any) -> Topology:
    topology = factory(*args)
    if not isinstance(topology, Topology):
        raise ConfigurationError(
            f"topology factory {spec!r} returned {type(topology).__name__}, not a Topology: "
            "return TopologyBuilder()...build()"
        )
    return topology


def topology_without_spark(spec: str, command: str) -> Topology:
    """The factory's topology, for a read-only ``command`` that runs no Spark: the
    factory must take no argument."""
    factory = load_factory(spec)
    if takes_spark(factory, spec):
        raise ConfigurationError(
            f"{spec} takes a SparkSession; `{command}` builds the topology without Spark: "
            "give it a factory that takes no argument"
        )
    return build_topology(factory, spec)
