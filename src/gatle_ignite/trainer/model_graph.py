"""The model's graph, for the logging sinks that draw one (TensorBoard): traced once, at a fresh
run's first iteration, on that iteration's batch, beside the run.

The traced call is the task's own ``forward`` on ``prep_batch``'s ``model_input``, without
gradients (torch traces in evaluation mode); the random streams, the buffers and the modes are
as they were after it (``side_step``), so a run is the same with or without it. Under FSDP it is
not drawn: a forward gathers shards on every rank, and only rank 0 draws. A resumed run keeps
the graph its start drew.
"""

import torch
from ignite.engine import Events

from gatle_ignite.trainer.side_step import modules_kept, random_streams_kept, without_ddp
from gatle_ignite.trainer.strategy import strategy_of

__all__ = ["attach_model_graph"]


class _TaskForward(torch.nn.Module):
    """The task's ``forward`` on a ``model_input`` whose tensors come as positional arguments,
    which is what tracing passes: a mapping's tensors (its other values held as they were), or
    the one tensor it is."""

    def __init__(self, trainer, model_input):
        super().__init__()
        # Registered, so the trace names the model's layers and reads its parameters.
        self.model = trainer.model
        self.forward_of = trainer.forward
        self.mapping = hasattr(model_input, "items")
        items = model_input.items() if self.mapping else []
        self.keys = [key for key, value in items if torch.is_tensor(value)]
        self.held = {key: value for key, value in items if key not in self.keys}
        self.inputs = tuple(model_input[key] for key in self.keys) if self.mapping else None
        if not self.mapping and torch.is_tensor(model_input):
            self.inputs = (model_input,)

    def forward(self, *tensors):
        if not self.mapping:
            return self.forward_of(tensors[0])
        return self.forward_of({**self.held, **dict(zip(self.keys, tensors))})


def attach_model_graph(trainer, overhead) -> None:
    """Trace the graph at the first iteration, when a sink of ``trainer.logger`` draws one;
    its time goes to ``overhead`` (a Stopwatch), not to the epoch's training time."""
    wants = getattr(trainer.logger, "wants_graph", None)
    if wants is None or not wants() or strategy_of(trainer.cfg) == "fsdp":
        return

    def draw_once(engine):
        engine.remove_event_handler(draw_once, Events.ITERATION_STARTED)
        if engine.state.iteration != 1:
            return  # a resumed run
        with overhead, random_streams_kept(trainer.device), without_ddp(trainer):
            with modules_kept([trainer.model, trainer.criterion]), torch.no_grad():
                model_input = trainer.prep_batch(engine.state.batch, split="train")["model_input"]
                module = _TaskForward(trainer, model_input)
                if module.inputs:
                    trainer.logger.graph(module, module.inputs)

    trainer.engines["trainer"].add_event_handler(Events.ITERATION_STARTED, draw_once)
