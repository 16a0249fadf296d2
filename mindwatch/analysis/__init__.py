"""Numbers readers compute from an opened run: downsampling that keeps every spike (:mod:`downsample`),
bands across ranks (:mod:`bands`), the run summary (:mod:`summary`), heat maps, and how durations read
(:mod:`units`). Used by the dashboard, the report, the checks and the terminal; writes nothing.
"""
