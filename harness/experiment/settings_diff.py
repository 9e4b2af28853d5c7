"""What differs between the two arms' effective server settings, and whether each difference is declared.

"Only the serving policy changed" is checked, not assumed: every command-line flag, environment variable
and arm setting is compared, and a difference not named in `policy_change` is flagged. Placement (port,
GPU ids, URL) may differ and is not a policy difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.experiment.config import PLACEMENT_KEYS, ExperimentConfig

PLACEMENT_FLAGS = frozenset({"--port"})
PROGRAM = "<program>"


@dataclass(frozen=True)
class SettingDifference:
    kind: str  # "arg" | "env" | "arm"
    key: str
    baseline: str | None
    candidate: str | None
    declared: bool


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not token.lstrip("-").replace(".", "").isdigit()


def parse_command(argv: list[str]) -> dict[str, str | None]:
    """Flags of a command line: `--x v`, `--x=v`, bare `--x` (None); leading words are the program."""
    settings: dict[str, str | None] = {}
    program: list[str] = []
    positionals = 0
    index = 0
    while index < len(argv):
        token = argv[index]
        if not _is_flag(token):
            if settings:  # a positional after the flags
                positionals += 1
                settings[f"<arg {positionals}>"] = token
            else:
                program.append(token)
            index += 1
            continue
        name, has_value, value = token.partition("=")
        if not has_value and index + 1 < len(argv) and not _is_flag(argv[index + 1]):
            value, has_value = argv[index + 1], True
            index += 1
        previous = settings.get(name)
        current = value if has_value else None
        settings[name] = current if previous is None else f"{previous} {current}"
        index += 1
    return {PROGRAM: " ".join(program)} | settings


def embedded_engine_args(argv: list[str]) -> list[str] | None:
    """The serve-sim arguments of a command that runs the embedded engine (`python -m harness.sim ...` or
    `replaybench serve-sim ...`), or None for any other server."""
    for index, token in enumerate(argv):
        if token == "serve-sim" or (token == "harness.sim" and index > 0 and argv[index - 1] == "-m"):
            return argv[index + 1 :]
    return None


def _compare(
    kind: str,
    base: dict[str, str | None],
    cand: dict[str, str | None],
    declared: set[str],
    ignore: frozenset[str] = frozenset(),
) -> list[SettingDifference]:
    missing = object()
    diffs = []
    for key in sorted(set(base) | set(cand)):
        b, c = base.get(key, missing), cand.get(key, missing)
        if key in ignore or b == c:
            continue
        diffs.append(
            SettingDifference(
                kind, key, None if b is missing else str(b), None if c is missing else str(c), key in declared
            )
        )
    return diffs


def arm_differences(config: ExperimentConfig) -> list[SettingDifference]:
    """Every difference in argv flags, env and arm settings (placement excluded); empty for A/A."""
    base, cand = config.arm("baseline"), config.arm("candidate")
    declared = set(config.policy_change)
    as_text = {
        k: None if v is None else str(v) for k, v in base.policy_settings().items() if k not in ("command", "env")
    }
    cand_text = {
        k: None if v is None else str(v) for k, v in cand.policy_settings().items() if k not in ("command", "env")
    }
    return (
        _compare("arg", parse_command(base.command or []), parse_command(cand.command or []), declared, PLACEMENT_FLAGS)
        + _compare("env", dict(base.env), dict(cand.env), declared)
        + _compare("arm", as_text, cand_text, declared, frozenset(PLACEMENT_KEYS))
    )
