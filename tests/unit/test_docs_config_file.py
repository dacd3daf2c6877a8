"""The config file of "Running a topology" (docs/how-to/run.md) loads as printed into the
settings its lines name: each key where the page says it goes, its value as written."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.docs import example
from transactional.cli.settings import load_settings


def test_the_docs_config_file_gives_the_settings_it_names(tmp_path: Path) -> None:
    text = example("docs/how-to/run.md", 'topology_id = "payments"', "toml").code
    config = tmp_path / "payments.toml"
    config.write_text(text)
    written = tomllib.loads(text)  # what the file says, read without the loader

    settings = load_settings(str(config), {}, {})
    assert settings.topology_id == written["topology_id"] == "payments"
    assert (settings.master, settings.state_dir) == (written["master"], written["state_dir"])
    assert (settings.batch_size, settings.until_drained) == (10000, True)
    assert settings.runner == written["runner"] == {"max_pending": 4, "attempt_timeout_s": 120}
    assert settings.spark == written["spark"]
    runner = settings.runner_config()
    assert (runner.max_pending, runner.attempt_timeout_s) == (4, 120)
