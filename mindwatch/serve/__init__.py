"""The live dashboard: ``mindwatch serve LOGDIR``.

Data flow: run directories (files are the source of truth) -> :mod:`runs` (catalog, safe lookup)
-> :mod:`mindwatch.store.columns` (incremental columnar reading; :mod:`cache` keeps it across
restarts) -> :mod:`downsample` (min/max per bucket)
-> :mod:`api` (JSON) and :mod:`live` (SSE push) -> ``static/`` (ECharts page). :mod:`auth`
guards it when exposed; :mod:`app` wires it together. Nothing here imports MindSpore.
"""
