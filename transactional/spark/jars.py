"""Spark packages (Delta's jars, say) resolved once from Maven Central, quietly.

Spark resolves ``spark.jars.packages`` with Ivy inside the JVM as the session starts,
and prints Ivy's whole report (and, for a default repository that is unreachable
here, one "host not found" error per artifact) straight to the terminal. So packages
are resolved beforehand, in a child process whose output goes to a log file, against
Maven Central only; sessions then load the resolved jars directly. A newcomer sees one
line, or, when the resolution fails, the lines of the log that say why.

Each set of packages gets a manifest listing exactly the jars its resolution retrieved:
the jars directory is shared, so after an upgrade it also holds the previous version's
jars, and loading every jar there would put two versions of a library on the classpath.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from transactional.errors import ConfigurationError
from transactional.spark.connect import client_only

__all__ = ["DEFAULT_IVY_DIR", "MAVEN_CENTRAL", "jar_name", "resolved_jars", "session_jars"]

#: Where packages are resolved to (``<dir>/jars``), listed (``<dir>/resolved``) and the
#: resolution logged (``<dir>/resolve.log``).
DEFAULT_IVY_DIR = Path.home() / ".cache" / "transactional" / "ivy"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"

_IVY_SETTINGS = """<ivysettings>
  <settings defaultResolver="central-only"/>
  <resolvers>
    <chain name="central-only" returnFirst="true">
      <ibiblio name="central" m2compatible="true" root="{root}"/>
    </chain>
  </resolvers>
</ivysettings>
"""

# Spark puts the jars it resolved into spark.jars (file: URIs): exactly this resolution's.
_RESOLVE = """
import os, sys
from urllib.parse import unquote, urlparse
from pyspark.sql import SparkSession
packages, excludes, ivy, settings, manifest = sys.argv[1:6]
session = (SparkSession.builder.master("local[1]").appName("resolve-packages")
           .config("spark.jars.packages", packages).config("spark.jars.excludes", excludes)
           .config("spark.jars.ivy", ivy)
           .config("spark.jars.ivySettings", settings).config("spark.ui.enabled", "false")
           .getOrCreate())
jars = [unquote(urlparse(uri).path) for uri in session.sparkContext.getConf().get("spark.jars", "").split(",") if uri]
session.stop()
with open(manifest + ".tmp", "w") as out:
    out.write("".join(jar + "\\n" for jar in jars))
os.replace(manifest + ".tmp", manifest)
"""

#: Lines of Ivy's log that say why a resolution failed.
_WHY = re.compile(r"not found|UNRESOLVED|unresolved|Exception|Error|FAILED|refused", re.IGNORECASE)
_COORDINATE = re.compile(r"[^:\s/]+:[^:\s/]+:[^:\s/]+")
_MODULE = re.compile(r"[^:\s/]+:[^:\s/]+")


def jar_name(coordinate: str) -> str:
    """The file Ivy retrieves for ``group:artifact:version``."""
    group, artifact, version = coordinate.split(":")
    return f"{group}_{artifact}-{version}.jar"


def resolved_jars(
    packages: Sequence[str],
    ivy_dir: str | Path | None = None,
    repository: str = MAVEN_CENTRAL,
    excludes: Sequence[str] = (),
) -> list[Path]:
    """The jars of ``packages`` (``group:artifact:version``) and of their dependencies
    but ``excludes`` (``group:artifact``, and what only they bring), resolving them first
    (one line on stderr, Ivy's report in ``<ivy_dir>/resolve.log``)
    unless an earlier resolution left all of them in place. Raises ``ConfigurationError``
    with the reason from Ivy's log (and the log's path) if the resolution fails.
    Ivy runs in a Spark driver: with PySpark's Connect client alone (``client_only``)
    there is none, and a ``ConfigurationError`` says so (the settings that name jars
    for a session leave them out there: a Connect server loads its own)."""
    bad = [p for p in packages if not _COORDINATE.fullmatch(p)]
    if bad or not packages:
        raise ConfigurationError(
            f"packages to resolve must be group:artifact:version, not {bad or list(packages)}"
        )
    bad = [e for e in excludes if not _MODULE.fullmatch(e)]
    if bad:
        raise ConfigurationError(f"packages to exclude must be group:artifact, not {bad}")
    if client_only():
        raise ConfigurationError(
            f"resolving {', '.join(packages)} needs PySpark with its JVM (pip install "
            "'transactional-spark[spark]'); this install has only the Spark Connect client"
        )
    ivy = Path(ivy_dir) if ivy_dir else DEFAULT_IVY_DIR
    manifest = ivy / "resolved" / f"{_key([*packages, *(f'-{e}' for e in excludes)])}.txt"
    if (jars := _listed(manifest)) is not None:
        return jars
    manifest.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(ivy / ".lock"):  # two first runs at once resolve once
        if (jars := _listed(manifest)) is None:
            jars = _resolve(packages, excludes, ivy, repository, manifest)
    return jars


def session_jars(
    packages: Sequence[str], ivy_dir: str | Path | None = None, excludes: Sequence[str] = ()
) -> list[Path]:
    """The jars a Spark session is given (``spark.jars``) for ``packages``: those
    ``resolved_jars`` returns, less each whose artifact Spark's own jars already hold at
    the same or a later version.

    Spark's class loaders ask Spark's own class path first, so a class that is in both is
    always Spark's: such a jar is never read, yet every executor fetches each jar of
    ``spark.jars`` into its work directory (a local master's as the session starts).
    delta-spark 4.4.0 brings 33 jars (89 MB), 75 MB of them libraries Spark 4.2 ships
    (Hadoop's client, Parquet, Jackson, Log4j, ...), most at older versions; Spark's Kafka
    reader 53 MB of its 64. A jar whose version cannot be compared, or that Spark holds
    older (whose newer classes only the resolved jar would have), is kept."""
    shipped = _spark_artifacts()
    kept = []
    for jar in resolved_jars(packages, ivy_dir, excludes=excludes):
        artifact, version = _artifact(jar.name.partition("_")[2])
        ours = shipped.get(artifact)
        if ours is None or version is None or ours < version:
            kept.append(jar)
    return kept


#: A jar's file name, ``<artifact>-<version>.jar``, with a version of numbers only.
_VERSIONED = re.compile(r"(?P<artifact>.+?)-(?P<version>\d+(?:[.-]\d+)*)\.jar")


def _artifact(name: str) -> tuple[str, tuple[int, ...] | None]:
    """(artifact, version) of a jar's file name; version None: none, or not only numbers."""
    found = _VERSIONED.fullmatch(name)
    if found is None:
        return name, None
    return found["artifact"], tuple(int(n) for n in re.split(r"[.-]", found["version"]))


def _spark_artifacts() -> dict[str, tuple[int, ...]]:
    """The artifacts of Spark's own jars and their versions (``SPARK_HOME``'s, else the
    installed PySpark's, as Spark's launcher takes them); empty where there are none."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    try:
        names = os.listdir(os.path.join(home, "jars"))
    except OSError:
        return {}
    found = (_artifact(name) for name in names)
    return {artifact: version for artifact, version in found if version is not None}


def _key(packages: Sequence[str]) -> str:
    """A file name for a set of packages: readable for one, a digest for many."""
    name = "+".join(sorted(p.replace(":", "_") for p in packages))
    return name if len(name) <= 120 else hashlib.sha256(name.encode()).hexdigest()[:32]


def _listed(manifest: Path) -> list[Path] | None:
    """The manifest's jars if it and every jar it lists exist, else None (resolve)."""
    try:
        jars = [Path(line) for line in manifest.read_text().splitlines() if line]
    except FileNotFoundError:
        return None
    return jars if jars and all(jar.is_file() for jar in jars) else None


@contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _resolve(
    packages: Sequence[str], excludes: Sequence[str], ivy: Path, repository: str, manifest: Path
) -> list[Path]:
    settings = ivy / "ivysettings.xml"
    settings.write_text(_IVY_SETTINGS.format(root=repository))
    log = ivy / "resolve.log"
    manifest.unlink(missing_ok=True)
    # Before the child starts, and flushed: a resolution downloads tens of MB (Delta's
    # jars ~90 MB, Spark's Kafka reader ~65 MB) in a minute or two, and a first run that
    # says nothing meanwhile looks hung.
    print(
        f"resolving {', '.join(packages)} from {repository}: a one-time download that may "
        f"take a minute or two (log: {log})",
        file=sys.stderr,
        flush=True,
    )
    with open(log, "w") as out:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _RESOLVE,
                *map(str, (",".join(packages), ",".join(excludes), ivy, settings, manifest)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    jars = _listed(manifest) if done.returncode == 0 else None
    names = {jar.name for jar in jars or ()}
    if jars is not None and all(jar_name(p) in names for p in packages):
        return jars
    why = [
        line.strip() for line in log.read_text(errors="replace").splitlines() if _WHY.search(line)
    ]
    shown = "\n  ".join(dict.fromkeys(why[:12])) or "(no reason in the log)"
    raise ConfigurationError(
        f"could not resolve {', '.join(packages)} from {repository} (exit {done.returncode}); "
        f"from {log}:\n  {shown}\nCheck that this machine reaches {repository}"
    )
