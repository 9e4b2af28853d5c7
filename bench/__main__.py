"""Run every benchmark module (or those named on the command line): `python -m bench [name ...]`."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    options = [a for a in argv if a.startswith("-")]
    if options:
        print(f"error: {' '.join(options)}: options go to one benchmark module, e.g. "
              "python -m bench.bench_record --quick --out DIR", file=sys.stderr)  # fmt: skip
        return 2
    wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in argv] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print(f"error: no benchmark {', '.join(unknown)}; choose from {', '.join(names)}", file=sys.stderr)
        return 2
    for name in wanted:
        print(f"== {name}", flush=True)
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
