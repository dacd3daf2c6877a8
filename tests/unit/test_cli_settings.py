"""The settings of ``transactional run``: a config file, ``TRANSACTIONAL_*`` variables,
``--conf`` items and flags, each overriding the one before; every bad setting is one
``ConfigurationError`` line naming it, where it came from and what is allowed. Also the
command itself refusing a bad setting with exit 2 before anything is created."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from transactional.cli import main
from transactional.cli._parser import build_parser
from transactional.cli.settings import (
    RUNNER_FIELDS,
    load_settings,
    load_store_settings,
    parse_conf,
)
from transactional.config import RunnerConfig
from transactional.errors import ConfigurationError

NO_FLAGS: dict[str, Any] = {}


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_file_then_env_then_conf_then_flags(tmp_path: Path) -> None:
    config = write(
        tmp_path / "t.toml",
        'topology_id = "from-file"\nmaster = "local[3]"\nbatch_size = 20\n'
        'state_dir = "file-dir"\n'
        "[runner]\nmax_pending = 3\nmax_attempts = 7\nattempt_timeout_s = 60\n"
        '[spark]\n"spark.sql.shuffle.partitions" = "8"\n',
    )
    env = {
        "TRANSACTIONAL_BATCH_SIZE": "30",
        "TRANSACTIONAL_MAX_PENDING": "4",
        "TRANSACTIONAL_MAX_ATTEMPTS": "5",
        "TRANSACTIONAL_STATE_DIR": "env-dir",
        "OTHER_MAX_PENDING": "9",  # not ours
    }
    conf = parse_conf(["max_pending=5", "runner.max_attempts=6", "spark.sql.shuffle.partitions=2"])
    flags = {"max_attempts": "8", "state_dir": None, "topology_id": "from-flag"}
    settings = load_settings(config, env, flags, conf)

    assert settings.topology_id == "from-flag"  # flag over file
    assert settings.master == "local[3]"  # file only
    assert settings.batch_size == 30  # env over file
    assert settings.state_dir == "env-dir"  # env over file; a flag of None is not given
    assert settings.spark == {"spark.sql.shuffle.partitions": "2"}  # --conf over file
    assert settings.runner_config() == RunnerConfig(
        topology_id="from-flag",
        max_pending=5,  # --conf over env over file
        max_attempts=8,  # flag over --conf over env over file
        attempt_timeout_s=60,  # file only
    )


def test_defaults_are_the_runner_configs() -> None:
    settings = load_settings(None, {}, {"topology_id": "t"})
    assert (settings.master, settings.state_dir, settings.zookeeper) == (
        "local[*]",
        ".transactional",
        None,
    )
    assert (settings.batch_size, settings.until_drained, settings.spark) == (None, False, {})
    assert settings.runner_config() == RunnerConfig(topology_id="t")


@pytest.mark.parametrize(
    ("raw", "expected"), [("auto", "auto"), ("100", 100), (250, 250)], ids=["auto", "text", "int"]
)
def test_batch_size(raw: Any, expected: Any) -> None:
    assert load_settings(None, {}, {"topology_id": "t", "batch_size": raw}).batch_size == expected


def test_none_lifts_a_timeout_from_flags_env_and_file(tmp_path: Path) -> None:
    config = write(tmp_path / "t.toml", '[runner]\nattempt_timeout_s = "none"\n')
    from_file = load_settings(config, {}, {"topology_id": "t"}).runner_config()
    assert from_file.attempt_timeout_s is None
    env = {"TRANSACTIONAL_LEADER_TIMEOUT_S": "30", "TRANSACTIONAL_ATTEMPT_TIMEOUT_S": "None"}
    flags = {"topology_id": "t", "leader_timeout_s": "none"}
    config_ = load_settings(None, env, flags).runner_config()
    assert (config_.attempt_timeout_s, config_.leader_timeout_s) == (None, None)
    with pytest.raises(ConfigurationError) as bad:  # only where None means something
        load_settings(None, {}, {"topology_id": "t", "max_pending": "none"})
    assert str(bad.value).startswith("runner setting max_pending='none' (from --max-pending): ")


def test_spark_table_keys_quoted_or_dotted_and_values_as_spark_reads_them(tmp_path: Path) -> None:
    config = write(
        tmp_path / "t.toml",
        'topology_id = "t"\n[spark]\n"spark.ui.enabled" = false\n'
        "spark.sql.shuffle.partitions = 8\nspark.sql.adaptive.enabled = true\n"
        "spark.memory.fraction = 0.5\n",
    )
    assert load_settings(config, {}, NO_FLAGS).spark == {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        "spark.memory.fraction": "0.5",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "max_pendng = 2\n",
            "unknown setting 'max_pendng' (did you mean 'max_pending', under [runner]?)",
        ),
        ("zzz = 2\n", "unknown setting 'zzz'; known: ['batch_size', 'crash_at', 'master', "),
        ("max_pending = 2\n", "['max_pending'] are runner settings: put them under [runner]"),
        (
            "[runner]\nmax_pendng = 2\nbatch_sise = 3\n",
            "unknown settings in [runner]: 'batch_sise' (did you mean 'batch_size', at the "
            "top?), 'max_pendng' (did you mean 'max_pending'?)",
        ),
        ("runner = 4\n", "[runner] must be a table"),
        ("[spark]\nsql.shuffle.partitions = 8\n", "['sql.shuffle.partitions'] in [spark] are "),
        ('[spark]\n"spark.jars" = ["a.jar"]\n', "['spark.jars'] in [spark] must be a string, "),
    ],
    ids=[
        "unknown",
        "unknown-far",
        "runner-at-top",
        "unknown-runner",
        "runner-not-table",
        "not-spark",
        "list",
    ],
)
def test_a_bad_config_file_names_the_setting(tmp_path: Path, text: str, message: str) -> None:
    config = write(tmp_path / "t.toml", text)
    with pytest.raises(ConfigurationError) as bad:
        load_settings(config, {}, {"topology_id": "t"})
    assert str(bad.value).startswith(f"config file {config}: {message}")
    assert "\n" not in str(bad.value)


def test_a_config_file_that_is_missing_or_not_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as missing:
        load_settings(str(tmp_path / "nope.toml"), {}, {"topology_id": "t"})
    assert str(missing.value) == f"config file {tmp_path / 'nope.toml'} does not exist"
    config = write(tmp_path / "t.toml", "max_pending = \n")
    with pytest.raises(ConfigurationError) as broken:
        load_settings(config, {}, {"topology_id": "t"})
    assert str(broken.value).startswith(f"config file {config} cannot be read as TOML: ")


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["spark.ui.enabled"], "--conf 'spark.ui.enabled': expected key=value"),
        (["=1"], "--conf '=1': expected key=value"),
        (
            ["maxpending=4"],
            "--conf 'maxpending=4': 'maxpending' is neither a Spark setting (spark.*) nor a "
            "runner setting: did you mean 'max_pending'?",
        ),
        (
            ["zzz=4"],
            "--conf 'zzz=4': 'zzz' is neither a Spark setting (spark.*) nor a runner setting "
            f"({', '.join(RUNNER_FIELDS)})",
        ),
    ],
    ids=["no-equals", "no-key", "unknown", "unknown-far"],
)
def test_a_malformed_conf_item(items: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError) as bad:
        parse_conf(items)
    assert str(bad.value) == message


def test_conf_values_keep_their_equals_signs() -> None:
    conf = parse_conf(["spark.driver.extraJavaOptions=-Da=b -Dc=d", "poll_interval_s=0.5"])
    assert conf == {
        "spark": {"spark.driver.extraJavaOptions": "-Da=b -Dc=d"},
        "runner": {"poll_interval_s": "0.5"},
    }


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        (
            {},
            {"max_pending": "0"},
            "runner setting max_pending='0' (from --max-pending): Input should be greater than "
            "or equal to 1",
        ),
        (
            {"TRANSACTIONAL_POLL_MAX_S": "0.5"},
            {"poll_interval_s": "2"},
            "runner settings: poll_max_s must be >= poll_interval_s (poll_max_s='0.5' from "
            "TRANSACTIONAL_POLL_MAX_S, poll_interval_s='2' from --poll-interval)",
        ),
        (
            {"TRANSACTIONAL_UNTIL_DRAINED": "maybe"},
            {},
            "setting until_drained='maybe' (from TRANSACTIONAL_UNTIL_DRAINED): Input should be "
            "a valid boolean",
        ),
        (
            {},
            {"batch_size": "0"},
            "setting batch_size='0' (from --batch-size): expected a number of at least 1 or "
            "'auto', not 0",
        ),
        (
            {},
            {"poll_interval_s": "40"},
            "runner settings: poll_max_s must be >= poll_interval_s (poll_max_s=30.0 by default, "
            "poll_interval_s='40' from --poll-interval)",
        ),
    ],
    ids=["max-pending-0", "poll-order", "bool", "batch-size-0", "poll-over-default"],
)
def test_a_bad_value_names_the_setting_and_its_source(
    env: dict[str, str], flags: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError) as bad:
        load_settings(None, env, {"topology_id": "t", **flags})
    assert str(bad.value).startswith(message)
    assert "\n" not in str(bad.value)


def test_no_topology_id() -> None:
    with pytest.raises(ConfigurationError) as bad:
        load_settings(None, {}, {"max_pending": "2"})
    assert str(bad.value).startswith("no topology id: give --topology-id ID")


def test_run_refuses_max_pending_0_with_exit_2_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's bug: a pydantic traceback and exit 1. Nothing is imported or created."""
    monkeypatch.chdir(tmp_path)
    code = main(["run", "not_imported:build", "--topology-id", "t", "--max-pending", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        "error: runner setting max_pending='0' (from --max-pending): Input should be greater "
        "than or equal to 1\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "verbose"),
    [
        (["run", "m:f"], 0),
        (["-v", "run", "m:f"], 1),
        (["run", "m:f", "-vv"], 2),
        (["status", "-v", "--topology-id", "t"], 1),
        (["list", "--verbose"], 1),
        (["query", "m:f", "state", "key", "-v"], 1),
        (["rewind", "m:f", "--to", "1", "-vv"], 2),
    ],
)
def test_verbose_before_or_after_the_command(argv: list[str], verbose: int) -> None:
    assert build_parser().parse_args(argv).verbose == verbose


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        ([], {}, (None, True)),
        (["--no-warm-up"], {}, (False, True)),
        (["--warm-up"], {}, (True, True)),
        ([], {"TRANSACTIONAL_WARM_UP": "true"}, (True, True)),
        (["--no-determinism-check"], {}, (None, False)),
        ([], {"TRANSACTIONAL_WARM_UP": "false"}, (False, True)),
    ],
)
def test_the_switches_of_run(
    flags: list[str], env: dict[str, str], expected: tuple[bool | None, bool], monkeypatch: Any
) -> None:
    from transactional.cli import _commands as cli

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["run", "m:f", "--topology-id", "t", *flags])
    config = cli._settings(args).runner_config()
    assert (config.warm_up, config.check_determinism) == expected


def test_the_table_declares_every_setting_once() -> None:
    """Every field of the settings models is in ``SETTINGS``, once: a field added
    without its row would have no flag, variable or config key."""
    from transactional.cli.settings import SETTINGS, RunSettings

    names = [s.name for s in SETTINGS]
    fields = {*RunSettings.model_fields, *RunnerConfig.model_fields} - {"runner", "spark"}
    assert sorted(names) == sorted(fields)
    assert len({s.flag for s in SETTINGS}) == len(SETTINGS)


def test_target_latency_sizes_auto_batches_only() -> None:
    """``--target-latency`` is the demo's flag, ``transactional run``'s too: the latency
    ``--batch-size auto`` keeps a txid under; with a fixed size it would do nothing."""
    auto = load_settings(None, {}, {"topology_id": "t", "batch_size": "auto"})
    assert auto.target_latency_s is None  # BatchSizeConfig's own, 10 s
    env = {"TRANSACTIONAL_TARGET_LATENCY_S": "4"}
    given = load_settings(None, env, {"topology_id": "t", "batch_size": "auto"})
    assert given.target_latency_s == 4.0
    with pytest.raises(ConfigurationError) as bad:
        load_settings(None, {}, {"topology_id": "t", "batch_size": "7", "target_latency_s": "4"})
    assert str(bad.value) == (
        "setting target_latency_s='4' (from --target-latency) sizes txids under --batch-size "
        'auto only: add --batch-size auto (or batch_size = "auto"), or drop it'
    )


#: What the command prints for a mistyped command or flag: one line naming the nearest.
TYPOS = {
    "flag": (
        ["run", "m:f", "--topology-id", "t", "--max-pendng", "2"],
        "transactional run: error: unknown flag --max-pendng: did you mean --max-pending? "
        "(`transactional run --help` lists its flags)",
    ),
    "flag=value": (
        ["run", "m:f", "--topology-id", "t", "--poll-mx=3"],
        "transactional run: error: unknown flag --poll-mx: did you mean --poll-max? "
        "(`transactional run --help` lists its flags)",
    ),
    "store-flag": (
        ["status", "--topology-id", "t", "--zookeper", "zk:2181"],
        "transactional status: error: unknown flag --zookeper: did you mean --zookeeper? "
        "(`transactional status --help` lists its flags)",
    ),
    "another-commands-flag": (
        ["status", "--topology-id", "t", "--max-pending", "2"],
        "transactional status: error: --max-pending is a flag of transactional run only "
        "(`transactional status --help` lists its flags)",
    ),
    "far-flag": (
        ["list", "--colour"],
        "transactional list: error: unknown flag --colour (`transactional list --help` lists "
        "its flags)",
    ),
    "command": (
        ["-v", "stauts", "--topology-id", "t"],
        "transactional: error: unknown command 'stauts': did you mean 'status'? (the "
        "commands: run, status, query, rewind, list)",
    ),
}


@pytest.mark.parametrize("typo", sorted(TYPOS))
def test_a_typo_is_one_line_naming_the_nearest_flag_or_command(
    typo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the top-level usage and "unrecognized arguments", for a flag of any
    command; argparse's list of every command for a mistyped one."""
    argv, line = TYPOS[typo]
    with pytest.raises(SystemExit) as leaving:
        main(argv)
    assert leaving.value.code == 2
    assert capsys.readouterr() == ("", line + "\n")


def test_a_mistyped_environment_variable_is_refused_with_the_nearest_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ignored, and the run went on with the default max_pending."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("TRANSACTIONAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRANSACTIONAL_MAX_PENDNG", "2")
    assert main(["run", "not_imported:build", "--topology-id", "t"]) == 2
    assert capsys.readouterr().err == (
        "error: environment variable TRANSACTIONAL_MAX_PENDNG (did you mean "
        "TRANSACTIONAL_MAX_PENDING?) names no setting: rename or unset it\n"
    )
    monkeypatch.setenv("TRANSACTIONAL_BLUE", "1")
    assert main(["list"]) == 2  # the store's commands read the environment too
    assert capsys.readouterr().err == (
        "error: environment variables TRANSACTIONAL_BLUE, TRANSACTIONAL_MAX_PENDNG (did you "
        "mean TRANSACTIONAL_MAX_PENDING?) name no setting: rename or unset them (a setting's "
        "variable is TRANSACTIONAL_ and its name in capitals: TRANSACTIONAL_MAX_PENDING for "
        "--max-pending)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_variables_of_ours_that_are_no_setting_of_the_table_are_known() -> None:
    """The ZooKeeper credentials are read from the environment only, by name."""
    env = {
        "TRANSACTIONAL_ZOOKEEPER_AUTH": "ops:secret",
        "TRANSACTIONAL_MAX_PENDING": "3",  # a run's setting: `status` takes it as known too
        "TRANSACTIONAL_CRASH_AT": "emit:9",
    }
    assert load_settings(None, env, {"topology_id": "t"}).runner["max_pending"] == "3"
    assert load_store_settings(None, env, {"topology_id": "t"}, "status").topology_id == "t"


def test_a_mistyped_config_file_key_is_one_line_from_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "run.toml", 'topology_id = "t"\n[runner]\nmax_pendng = 2\n')
    assert main(["run", "not_imported:build", "--config", "run.toml"]) == 2
    assert capsys.readouterr().err == (
        "error: config file run.toml: unknown setting in [runner]: 'max_pendng' (did you "
        "mean 'max_pending'?)\n"
    )
