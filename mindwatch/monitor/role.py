"""What one rank does in its run, worked out once: which watches it runs, how it agrees on actions with the others.

Example::

    role = RankRole(rank=0, world_size=8, collective=True, coordinated=True)
    role.watches_every_rank      # True: rank 0's cross-rank watch (stragglers, bands, hangs, lost ranks)
    role.serves_lifeline         # True: every other rank holds a connection to it
    role.agrees_through_files    # False: the train step's collective carries the requests

Not the launcher's process role (``MS_WORKER`` / ``MS_SCHED``, :mod:`mindwatch.mindspore.ranks`): this is the part
a training rank plays for mindwatch. The session builds its collaborators from it; the cross-rank watch reads
``collective`` here rather than being told it again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankRole:
    """This rank's part in the run (see the module docstring)."""

    rank: int = 0
    world_size: int = 1
    #: The ranks agree on actions, and rank 0 learns every rank's timings, through the train step's own collective
    #: (the adapter's signal, :mod:`mindwatch.mindspore.rank_signal`), not through files in ``control/``.
    collective: bool = False
    #: The ranks agree on the step each action is carried out at (more than one rank, ``distributed.coordination``).
    coordinated: bool = False

    @property
    def multi_rank(self) -> bool:
        return self.world_size > 1

    @property
    def speaks_for_the_run(self) -> bool:
        """Whether this rank raises the alerts on values every rank shares (``grad_norm`` after the gradient
        all-reduce, ``lr``, the per-layer norms): rank 0 does, once for the run; the others act on them only."""
        return self.rank == 0 or self.world_size == 1

    @property
    def keeps_meta(self) -> bool:
        """Rank 0 writes ``meta.json``: the run's attempts, its plan, how it ended."""
        return self.rank == 0

    @property
    def notifies(self) -> bool:
        """Rank 0 alone sends notifications; it forwards the other ranks' alerts."""
        return self.rank == 0

    @property
    def watches_every_rank(self) -> bool:
        """Rank 0 of a multi-rank run: stragglers, bands, hangs and the other ranks' liveness."""
        return self.rank == 0 and self.world_size > 1

    @property
    def watches_rank_zero(self) -> bool:
        """Rank 1 of a multi-rank run names rank 0 when it dies (rank 0 cannot name itself)."""
        return self.rank == 1 and self.world_size > 1

    @property
    def serves_lifeline(self) -> bool:
        """Rank 0 of a collective run: every other rank connects to it, so a rank that dies is known at once."""
        return self.watches_every_rank and self.collective

    @property
    def relays_stacks(self) -> bool:
        """A rank > 0 of a collective run: a stall's stack dump goes to rank 0 over the lifeline."""
        return self.rank > 0 and self.collective

    @property
    def agrees_through_files(self) -> bool:
        """The ranks agree on actions through ``control/`` (train cells not ours: no collective carries them)."""
        return self.coordinated and not self.collective
