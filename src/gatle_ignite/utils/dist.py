"""Rank-aware output: framework lines are printed once per run, by rank 0."""

import ignite.distributed as idist

__all__ = ["rank_zero_print"]


def rank_zero_print(*args, **kwargs) -> None:
    if idist.get_rank() == 0:
        print(*args, **kwargs)
