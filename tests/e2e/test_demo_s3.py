"""The demo into Delta tables in a bucket of the S3 stand-in (moto's server), reached only
through the standard AWS settings a user sets for S3: killed with SIGKILL right after
its sink write of a txid, in both modes, then run again with the same arguments; the
tables, read back with ``deltalake``, hold every record exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.history import judge, read_delta
from tests.processes import ROOT, DemoProcess, demo_env, generated_tweets, printed_tops
from tests.reference import Expected
from transactional.testing.servers import S3Server

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    return generated_tweets(tmp_path_factory.mktemp("tweets"), 240, seed=40)


@pytest.mark.parametrize("spout", ["transactional", "opaque"])
def test_the_demo_on_s3_killed_after_its_sink_write_counts_every_record_once(
    tweets: tuple[Path, Expected],
    s3_server: S3Server,
    spout: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, expected = tweets
    bucket = s3_server.bucket()
    env = demo_env(**s3_server.settings)
    tables = f"s3://{bucket}/delta"
    args = [
        "run", "--input", str(path), "--spout", spout, "--sink", "delta",
        "--delta-path", tables, "--state-dir", str(tmp_path / "state"),
        "--batch-size", "40", "--until-drained", "--master", "local[1]", "--top", "0",
        "--record-ids",
    ]  # fmt: skip
    crashed = DemoProcess([*args, "--crash-at", "after_sink_write:2"], tmp_path / "r1.log", env)
    code = crashed.wait()
    assert code == -9 and "crash_at point=after_sink_write txid=2 " in crashed.output(), (
        crashed.tail()
    )
    again = DemoProcess(args, tmp_path / "r2.log", env)
    assert again.wait() == 0, again.tail()
    for name, value in s3_server.settings.items():  # deltalake reads the same settings
        monkeypatch.setenv(name, value)
    verdict = judge(read_delta(tables), expected)
    assert verdict.exact, str(verdict)
    assert not (ROOT / "s3:").exists()  # nothing written to a local "s3:" directory


def test_the_docs_demo_into_a_bucket_runs_as_printed(s3_server: S3Server, tmp_path: Path) -> None:
    """The S3 page's commands, typed in a fresh directory with the stand-in's settings in
    the environment and its bucket for the page's ``lake``: the tables, read back with
    ``deltalake``, hold the generated tweets' counts exactly, and ``show`` prints their
    top hashtags."""
    from tests.docs import example, run_shell
    from tests.reference import expected_counts

    bucket = s3_server.bucket()
    commands = example("docs/how-to/object-storage.md", "examples.tweets generate", "sh")
    printed = run_shell(
        commands,
        tmp_path,
        replace={"s3://lake/": f"s3://{bucket}/"},
        env=demo_env(**s3_server.settings),
    )
    expected = expected_counts(tmp_path / "tweets.jsonl")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3_server.settings.items():
            patch.setenv(name, value)
        verdict = judge(read_delta(f"s3://{bucket}/tweets"), expected, ids=False)
    assert verdict.exact, str(verdict)
    top = sorted(expected.hashtags.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    assert printed_tops(printed[-1])[("", "top hashtags")] == top  # show's default --top
