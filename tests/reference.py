"""An answer computed independently of the code under test: the demo's counting rule
written again in plain Python, over the raw bytes of the input files."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

ASCII_WHITESPACE = re.compile(r"[ \t\n\r\x0b\x0c]+")


@dataclass
class Expected:
    hashtags: Counter[str] = field(default_factory=Counter)
    users: Counter[str] = field(default_factory=Counter)
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    dead_letters: list[str] = field(default_factory=list)
    tweets: int = 0
    #: Valid tweets by id (each once, unless the input repeats a tweet).
    ids: Counter[int] = field(default_factory=Counter)


def input_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


def lines_of(path: Path) -> list[bytes]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def records_of(path: Path) -> list[tuple[str, str | None]]:
    """The spouts' records ``(raw, error)`` of a file: each line decoded, or escaped and
    flagged when it is not UTF-8."""
    out: list[tuple[str, str | None]] = []
    for line in lines_of(path):
        try:
            out.append((line.decode("utf-8"), None))
        except UnicodeDecodeError:
            out.append((line.decode("utf-8", "backslashreplace"), "invalid UTF-8"))
    return out


def expected_counts(path: Path) -> Expected:
    return expected_of_lines(line for file in input_files(path) for line in lines_of(file))


def expected_of_range(file: Path, offset: int, length: int) -> Expected:
    """The answer for bytes ``[offset, offset + length)`` of ``file``: whole lines, as a
    batch's byte range holds them."""
    with file.open("rb") as f:
        f.seek(offset)
        data = f.read(length)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return expected_of_lines(line[:-1] if line.endswith(b"\r") else line for line in lines)


def combined(*parts: Expected) -> Expected:
    """Every part counted: what a sink holds that took each part once."""
    out = Expected()
    for part in parts:
        out.hashtags.update(part.hashtags)
        out.users.update(part.users)
        out.pairs.update(part.pairs)
        out.dead_letters.extend(part.dead_letters)
        out.tweets += part.tweets
        out.ids.update(part.ids)
    return out


def without(whole: Expected, part: Expected) -> Expected:
    """``whole`` less ``part`` (which it holds): what a sink holds that lost ``part``."""
    out = Expected(
        whole.hashtags - part.hashtags,
        whole.users - part.users,
        whole.pairs - part.pairs,
        list(whole.dead_letters),
        whole.tweets - part.tweets,
        whole.ids - part.ids,
    )
    for raw in part.dead_letters:
        out.dead_letters.remove(raw)
    return out


def expected_of_lines(lines: Iterable[bytes]) -> Expected:
    """The answer for the records of ``lines`` (each without its line end)."""
    out = Expected()
    for raw in lines:
        parsed = _parse(raw)
        if parsed is None:
            out.dead_letters.append(raw.decode("utf-8", "backslashreplace"))
            continue
        tweet_id, tweet = parsed
        out.tweets += 1
        out.ids[tweet_id] += 1
        tokens = [t for t in ASCII_WHITESPACE.split(tweet) if t]
        tags = {t for t in tokens if t.startswith("#") and len(t) >= 2}
        users = {t for t in tokens if t.startswith("@") and len(t) >= 2}
        out.hashtags.update(tags)
        out.users.update(users)
        out.pairs.update(product(users, tags))
    return out


def _reject(value: object) -> object:
    raise ValueError(f"not JSON: {value}")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("duplicate key")
    return dict(pairs)


def _parse(raw: bytes) -> tuple[int, str] | None:
    """Strict RFC 8259 JSON: no NaN/Infinity, no duplicate keys, no lone surrogates;
    ``id`` an integer (not a boolean) that fits in 64 bits, ``text`` a string. The
    tweet's ``(id, text)``, or None for a dead letter."""
    try:
        obj = json.loads(
            raw.decode("utf-8"), parse_constant=_reject, object_pairs_hook=_unique_keys
        )
        json.dumps(obj, ensure_ascii=False).encode("utf-8")  # lone surrogates fail here
    except (UnicodeDecodeError, UnicodeEncodeError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    tweet_id, text = obj.get("id"), obj.get("text")
    if type(tweet_id) is not int or not -(2**63) <= tweet_id < 2**63:
        return None
    return (tweet_id, text) if isinstance(text, str) else None


#: The orders of the README's and the Files page's examples: CSV lines by file name.
ORDERS = {
    "2026-11-01.csv": ["shop,amount", "north,12", "south,5", "north,-2", "south,12.5"],
    "2026-11-02.csv": ["shop,amount", "west,7", "north,1,2", "north,30"],
}


def write_orders(directory: Path) -> Path:
    """``ORDERS`` written as files into ``directory`` (made), which is returned."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, lines in ORDERS.items():
        (directory / name).write_text("\n".join(lines) + "\n")
    return directory


def expected_orders() -> tuple[Counter[str], list[str]]:
    """The totals by shop and the bad lines of ``ORDERS``, read from their text: a line
    is an order when it has two fields and the second is an integer."""
    totals: Counter[str] = Counter()
    bad = []
    for lines in ORDERS.values():
        for line in lines[1:]:
            fields = line.split(",")
            if len(fields) == 2 and fields[1].lstrip("-").isdigit():
                totals[fields[0]] += int(fields[1])
            else:
                bad.append(line)
    return totals, bad
