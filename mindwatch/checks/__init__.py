"""``mindwatch check``: the rule language (:mod:`language`, e.g. ``final(loss) < 2.5``) and its
evaluation over an opened run (:mod:`evaluate`), for CI gates.
"""
