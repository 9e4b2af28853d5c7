"""The plugin check of an arm: a server log line, not the server's echo of its command line, must prove it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import UserError
from harness.experiment.arm_server import ArmServer
from harness.experiment.config import ArmConfig
from harness.servers.process import LOG_HEADER

ECHO = "INFO [api_utils.py:273] non-default args: {'additional_config': {'replayssm': {'enable': True}}}\n"
ACTIVE = "INFO [mixer.py:149] ReplaySSM active: MambaMixer2 layers replaced (buffer_len=16, split_precision=False)\n"


def arm_with_log(tmp_path: Path, text: str, **fields: object) -> ArmServer:
    log = tmp_path / "server.log"
    log.write_text(text)
    return ArmServer("candidate", ArmConfig(url="http://127.0.0.1:8001", plugin="replayssm", log=log, **fields))


def test_the_plugins_own_line_proves_it_is_active(tmp_path: Path) -> None:
    arm_with_log(tmp_path, ECHO + ACTIVE, plugin_log_line="ReplaySSM active").verify({})


def test_the_command_line_echo_alone_does_not(tmp_path: Path) -> None:
    server = arm_with_log(tmp_path, f"{LOG_HEADER} --additional-config replayssm\n" + ECHO,
                          plugin_log_line="ReplaySSM active")  # fmt: skip
    with pytest.raises(UserError, match=r"plugin 'replayssm' is not active: no line of the server log .* contains "
                       r"'ReplaySSM active'"):  # fmt: skip
        server.verify({})


def test_without_a_log_line_the_plugin_name_is_the_evidence(tmp_path: Path) -> None:
    arm_with_log(tmp_path, ACTIVE).verify({})
    with pytest.raises(UserError, match="contains 'replayssm'"):
        arm_with_log(tmp_path, f"{LOG_HEADER} vllm serve --additional-config replayssm\n").verify({})


def test_the_evidence_line_is_placement_not_policy(tmp_path: Path) -> None:
    """Only the candidate needs it, so it must not count as an undeclared settings difference."""
    arm = ArmConfig(url="http://127.0.0.1:8001", plugin_log_line="ReplaySSM active")
    assert "plugin_log_line" not in arm.policy_settings()
