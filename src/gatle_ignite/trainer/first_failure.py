"""Which rank's failure ended a run of several ranks.

When one rank raises, its peers fail after it, waiting in a collective it never joins (gloo:
"Connection closed by peer"): the rank to name is the one that failed first. Every failing rank
offers its reason to the process group's store before its process exits, and so before its
peers can see the symptom; the store keeps the first offer, and rank 0 records that one.
"""

import ignite.distributed as idist
import torch

__all__ = ["first_failure"]

_KEY = "gatle_ignite/first_failure/"


def first_failure(reason: str, run: str) -> str:
    """The reason ``run`` failed: this rank's own, or one an earlier failing rank offered."""
    if idist.get_world_size() <= 1:
        return reason
    offered = f"rank {idist.get_rank()}: {reason}"
    try:
        store = torch.distributed.distributed_c10d._get_default_store()
        kept = store.compare_set(_KEY + run, "", offered)
    except Exception:
        # No store to ask (the group is gone, or its host with it): this rank's own reason.
        return offered
    return kept.decode("utf-8", "replace")
