"""The live dashboard: ``mindwatch serve LOGDIR``.

Data flow: run directories (files are the source of truth) -> :mod:`views` (catalog, safe lookup)
-> :mod:`mindwatch.store.columns` (incremental columnar reading; :mod:`mindwatch.store.cache` keeps it
across restarts) -> :mod:`mindwatch.analysis.downsample` (min/max per bucket)
-> :mod:`api` (JSON) and :mod:`live` (SSE push, positions in :mod:`cursor`) -> ``static/`` (ECharts page).
:mod:`auth` guards it when exposed; :mod:`app` wires it together. Nothing here imports MindSpore.
"""
