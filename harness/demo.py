"""`make demo`: import the shipped Azure trace and show what it looks like (grows into a paired replay)."""

from __future__ import annotations

from harness.cli import app


def main() -> None:
    app(["--help"], standalone_mode=False)


if __name__ == "__main__":
    main()
