"""Secrets in addresses and library logs are shown as ``***``."""

from __future__ import annotations

import logging

import pytest

from transactional.secrets import mask_in_logs, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        (
            "rediss://u:p%40ss@h:1/0?ssl_ca_certs=/ca.crt",
            "rediss://u:***@h:1/0?ssl_ca_certs=/ca.crt",
        ),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://user@host:6379/0", "redis://user@host:6379/0"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_masked_secret_shows_in_no_record_of_the_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("kazoo.client")
    mask_in_logs("hunter2", "kazoo.client")
    with caplog.at_level(logging.DEBUG, logger="kazoo.client"):
        logger.debug("Sending request: Auth(auth='ops:%s')", "hunter2")
        logger.debug("no secret here: %s", 42)
    assert [r.getMessage() for r in caplog.records] == [
        "Sending request: Auth(auth='ops:***')",
        "no secret here: 42",
    ]
