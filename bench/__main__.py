"""`python -m bench <name> [args...]`: import bench.<name> and call its main(); no name lists them."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

NOT_BENCHMARKS = {"common", "durable_workflows"}


def available() -> list[str]:
    names = []
    for info in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if info.name.startswith("_") or info.name in NOT_BENCHMARKS:
            continue
        names.append(info.name)
    return sorted(names)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: python -m bench <name> [args...]   (make bench NAME=<name>)\n\navailable benchmarks:")
        for name in available():
            print(f"  {name}")
        return 0 if argv else 2
    name = argv[0]
    if name not in available():
        print(f"unknown benchmark {name!r}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{name}")
    sys.argv = [f"bench {name}", *argv[1:]]
    result = module.main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
