"""Spark packages (Delta's jars, say) resolved once from Maven Central, quietly.

Spark resolves ``spark.jars.packages`` with Ivy inside the JVM as the session starts,
and prints Ivy's whole report (and, for a default repository that is unreachable
here, one "host not found" error per artifact) straight to the terminal. So packages
are resolved beforehand, in a child process whose output goes to a log file, against
Maven Central only; sessions then load the resolved jars directly. A newcomer sees one
line, or, when the resolution fails, the lines of the log that say why.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from transactional.errors import ConfigurationError

#: Where packages are resolved to (``<dir>/jars``) and the resolution logged.
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

_RESOLVE = """
import sys
from pyspark.sql import SparkSession
packages, ivy, settings = sys.argv[1:4]
session = (SparkSession.builder.master("local[1]").appName("resolve-packages")
           .config("spark.jars.packages", packages).config("spark.jars.ivy", ivy)
           .config("spark.jars.ivySettings", settings).config("spark.ui.enabled", "false")
           .getOrCreate())
session.stop()
"""

#: Lines of Ivy's log that say why a resolution failed.
_WHY = re.compile(r"not found|UNRESOLVED|unresolved|Exception|Error|FAILED|refused", re.IGNORECASE)


def jar_name(coordinate: str) -> str:
    """The file Ivy retrieves for ``group:artifact:version``."""
    group, artifact, version = coordinate.split(":")
    return f"{group}_{artifact}-{version}.jar"


def resolved_jars(
    packages: Sequence[str], ivy_dir: str | Path | None = None, repository: str = MAVEN_CENTRAL
) -> list[Path]:
    """The jars of ``packages`` (``group:artifact:version``) and their dependencies,
    resolving them first if any is missing. Raises ``ConfigurationError`` with the
    reason from Ivy's log (and the log's path) if the resolution fails."""
    ivy = Path(ivy_dir) if ivy_dir else DEFAULT_IVY_DIR
    jars = ivy / "jars"
    if not all((jars / jar_name(p)).is_file() for p in packages):
        _resolve(packages, ivy, repository)
    return sorted(jars.glob("*.jar"))


def _resolve(packages: Sequence[str], ivy: Path, repository: str) -> None:
    ivy.mkdir(parents=True, exist_ok=True)
    settings = ivy / "ivysettings.xml"
    settings.write_text(_IVY_SETTINGS.format(root=repository))
    log = ivy / "resolve.log"
    print(
        f"resolving {', '.join(packages)} from {repository} (first run; log: {log})",
        file=sys.stderr,
        flush=True,
    )
    with open(log, "w") as out:
        done = subprocess.run(
            [sys.executable, "-c", _RESOLVE, ",".join(packages), str(ivy), str(settings)],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    missing = [p for p in packages if not (ivy / "jars" / jar_name(p)).is_file()]
    if done.returncode == 0 and not missing:
        return
    why = [
        line.strip() for line in log.read_text(errors="replace").splitlines() if _WHY.search(line)
    ]
    shown = "\n  ".join(dict.fromkeys(why[:12])) or "(no reason in the log)"
    raise ConfigurationError(
        f"could not resolve {', '.join(packages)} from {repository} (exit {done.returncode}); "
        f"from {log}:\n  {shown}\nCheck that this machine reaches {repository}"
    )
