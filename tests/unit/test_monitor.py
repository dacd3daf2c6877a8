"""``tests.monitor``'s reading of a MONITOR log (the lines as Redis writes them): which
writes came from a client, and which commit scripts wrote under a lower fence token
than one before them."""

from __future__ import annotations

from pathlib import Path

from tests.monitor import ScriptWrites


def script(at: float, token: int, *writes: str) -> list[str]:
    payload = '"{\\"txid\\": \\"1\\", \\"fence\\": \\"TOKEN\\"}"'.replace("TOKEN", str(token))
    lines = [f'{at:.6f} [3 127.0.0.1:40000] "EVALSHA" "abc" "1" "ns:txid" {payload}']
    lines += [f'{at + 0.0001:.6f} [3 lua] "GET" "ns:fence"']
    lines += [f"{at + 0.0002:.6f} [3 lua] {w}" for w in writes]
    return lines


def test_a_write_under_a_lower_fence_and_a_clients_write_are_named(tmp_path: Path) -> None:
    lines = [
        *script(1.0, 1, '"HSET" "h" "a" "1"', '"SET" "ns:fence" "1"'),
        *script(2.0, 2, '"HSET" "h" "a" "2"', '"SET" "ns:fence" "2"'),
        *script(3.0, 1),  # refused: read the fence, wrote nothing
        *script(4.0, 1, '"HSET" "h" "b" "1"'),  # got through
        '5.000000 [3 127.0.0.1:40000] "RPUSH" "ns:stage:' + "0" * 32 + '" "[]"',
        '5.100000 [3 127.0.0.1:40000] "SET" "ns:txid" "4"',
        '5.200000 [4 127.0.0.1:40000] "SET" "other-db" "1"',
    ]
    log = tmp_path / "monitor.log"
    log.write_text("\n".join(lines) + "\n")
    writes = ScriptWrites("redis://127.0.0.1:1/3", log)
    assert writes.fences() == [1, 2, 1, 1]
    assert writes.deposed() == ["fence 1 wrote HSET h after fence 2 had"]
    assert writes.outside() == ["SET ns:txid (from 127.0.0.1:40000)"]
