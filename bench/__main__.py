"""Run benchmarks: ``python -m bench`` (all), ``python -m bench overhead dashboard``, or one with its options:
``python -m bench overhead --rounds 15``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name[len("bench_") :] for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))


def main(argv: list[str]) -> int:
    first = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    names, options = argv[:first] or available(), argv[first:]
    if options and len(names) != 1:
        print("options go to one benchmark: python -m bench NAME --option ...", file=sys.stderr)
        return 2
    unknown = [n for n in names if n not in available()]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    for name in names:
        print(f"\n=== bench {name} ===", flush=True)
        start = time.time()
        module = importlib.import_module(f"bench.bench_{name}")
        if options:
            module.main(options)
        else:
            module.main()
        print(f"(bench {name}: {time.time() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
