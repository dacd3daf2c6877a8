"""The demo into Delta tables in a bucket of the S3 stand-in (moto's server), reached only
through the standard AWS settings a user sets for S3, as the object-storage page types
it. The demo SIGKILLed at every protocol step with its input and tables in a bucket,
both modes, is the crash matrix's (``tests/e2e/test_crash_matrix.py``, ``-s3``
chains, ``make test-slow``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.history import judge, read_delta
from tests.processes import demo_env, printed_tops
from transactional.testing.servers import S3Server

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


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
    # Nothing went to a local directory named "s3:" in the directory the commands ran in.
    assert not (tmp_path / "s3:").exists(), sorted(p.name for p in tmp_path.iterdir())
