"""The device mesh of a run: ``W`` processes as ``D = W / C`` data-parallel groups of ``C``
context-parallel ranks (``context_parallel_size`` = C). Pure, torch-free.

Rank ``r`` is in data-parallel group ``r // C`` at context-parallel position ``r % C``: the C
ranks of a group are consecutive (on one node where a node holds a multiple of C), train the
identical micro-batch (samples, crops, noise, timesteps) and each hold 1/C of its sequence. The
split, the sampler, the audit and ``plan`` see D groups where they saw W ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


class MeshError(ValueError):
    """context_parallel_size does not divide the number of processes."""


def mesh_problem(processes: int, context_parallel: int) -> str | None:
    """Why ``processes`` cannot form groups of ``context_parallel`` ranks, else None."""
    if context_parallel >= 1 and processes % context_parallel == 0:
        return None
    divisors = [c for c in range(1, processes + 1) if processes % c == 0]
    return (f"context_parallel_size {context_parallel} does not divide the {processes} "
            f"processes: they form data-parallel groups of context_parallel_size ranks each; "
            f"use a context_parallel_size that divides {processes} "
            f"({', '.join(map(str, divisors))}) or a number of processes that is a multiple of "
            f"{context_parallel}")


@dataclass(frozen=True)
class Mesh:
    processes: int             # W
    context_parallel: int = 1  # C

    def __post_init__(self):
        problem = mesh_problem(self.processes, self.context_parallel)
        if problem:
            raise MeshError(problem)

    @property
    def data_parallel(self) -> int:
        """D: the groups the split slices for."""
        return self.processes // self.context_parallel

    def group_of(self, rank: int) -> int:
        """The data-parallel group of ``rank``: what the split and the noise are keyed by."""
        if not 0 <= rank < self.processes:
            raise ValueError(f"rank {rank} is outside 0..{self.processes - 1}")
        return rank // self.context_parallel

    def ranks_of(self, group: int) -> range:
        """The ranks of one data-parallel group (one context-parallel group)."""
        return range(group * self.context_parallel, (group + 1) * self.context_parallel)

    def describe(self) -> str:
        if self.context_parallel == 1:
            return f"{self.processes} processes"
        return (f"{self.processes} processes as {self.data_parallel} data-parallel groups x "
                f"{self.context_parallel} context-parallel ranks")
