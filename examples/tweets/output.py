"""What the demo prints: the top counts of a sink as tables."""

from __future__ import annotations

from typing import TextIO

from examples.tweets.sinks import TABLE_KEYS, Summary


def print_summary(summary: Summary, out: TextIO, dead_letters: bool = True, sink: str = "") -> None:
    """``sink``: a name to put before the titles, when several sinks are shown."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=out)
    if sink:
        console.print(Text(f"{sink}:", style="bold"))
    titles = {"hashtags": "top hashtags", "users": "top users", "users_hashtags": "top pairs"}
    for name, rows in summary.tops.items():
        table = Table(title=titles.get(name, name), title_justify="left")
        table.add_column(" / ".join(TABLE_KEYS.get(name, ("key",))))
        table.add_column("count", justify="right")
        for key, count in rows:
            # Text, not markup: a tag like "#[b]" must print as itself. Escapes make
            # invisible characters (a no-break space) visible.
            shown = key if key.isprintable() else repr(key)[1:-1]
            table.add_row(Text(shown), f"{count:,}")
        console.print(table)
    if dead_letters:
        console.print(f"dead letters: {summary.dead_letters:,}")
