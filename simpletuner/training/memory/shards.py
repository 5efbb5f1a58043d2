"""The part of a tensor one rank holds: all of it (DDP), or FSDP2's dim-0 chunk, which
follows torch.chunk (rank r holds chunk r; the last ranks may hold fewer rows, or none)."""

from __future__ import annotations

import math
from dataclasses import dataclass


def shard_rows(rows: int, rank: int, world: int) -> int:
    size = math.ceil(rows / world)
    return max(0, min(size, rows - rank * size))


@dataclass(frozen=True)
class RankPart:
    """Rank ``rank`` of ``world``; ``sharded`` False: every rank holds whole tensors."""

    rank: int = 0
    world: int = 1
    sharded: bool = False

    def numel(self, shape: tuple[int, ...]) -> int:
        """Elements this rank holds of a tensor of ``shape`` (a scalar lives on rank 0)."""
        if not self.sharded:
            return math.prod(shape)
        if not shape:
            return 1 if self.rank == 0 else 0
        return shard_rows(shape[0], self.rank, self.world) * math.prod(shape[1:])


WHOLE = RankPart()
