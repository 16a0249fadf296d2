"""The building blocks of every ``monitor_config`` section: a strict pydantic base and the shared value types.

Example::

    from mindwatch.schema import Section

    class MySettings(Section):        # unknown keys and wrong types are errors naming the key
        every: int = Field(default=10, ge=1)

:mod:`mindwatch.config` assembles the sections; each alert rule declares its own settings
next to the rule (:mod:`mindwatch.alerts.rules`), so both build on this module and neither on the other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: What an alert rule may ask the training to do (the MindSpore callback carries it out).
Action = Literal["stop", "checkpoint", "lr_backoff", "dump_stacks", "rewind", "shrink_batch", "grow_batch", "profile"]
Severity = Literal["info", "warning", "error"]


class Section(BaseModel):
    """A config section: unknown keys are errors and defaults are validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class RuleSettings(Section):
    """Settings every alert rule has: on/off and the actions it requests when it fires."""

    enabled: bool = True
    actions: list[Action] = Field(default_factory=list)
