"""Benchmarks: each ``bench/bench_<name>.py`` has a ``main()`` that prints its figures and ratios."""
