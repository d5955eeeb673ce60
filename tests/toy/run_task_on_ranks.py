"""Call ``launch.run_task`` on 2 gloo ranks under ``idist.Parallel``, as a user would, and print
what each rank got back.

    python -m tests.toy.run_task_on_ranks CONFIG_PATH PORT [KEY=VALUE ...]
"""

import sys

import ignite.distributed as idist

from gatle_ignite.cli import launch
from gatle_ignite.config.loader import apply_overrides, load_config_from_file


def report(local_rank, cfg):
    task = launch.run_task(local_rank, cfg)
    iterations = task.engines["trainer"].state.iteration
    print(
        f"rank {idist.get_rank()} got {type(task).__name__} with a "
        f"{type(task.model).__name__} model after {iterations} iterations",
        flush=True,
    )


if __name__ == "__main__":
    config, port, *overrides = sys.argv[1:]
    cfg = load_config_from_file(config)
    apply_overrides(cfg, overrides)
    with idist.Parallel(
        backend="gloo", nproc_per_node=2, master_addr="127.0.0.1", master_port=int(port)
    ) as parallel:
        parallel.run(report, cfg)
