"""Template for ``lr_scheduler``: returns ``(scheduler, engine_name, event)``."""

from ignite.engine import Events
from ignite.handlers import LRScheduler
from torch.optim.lr_scheduler import StepLR


def get_scheduler(cfg, train_dl, optimizer, engines, step_every_epochs=5, gamma=0.1):
    """Multiply the LR by ``gamma`` every ``step_every_epochs`` trainer epochs.

    ``engines`` holds every built engine (declared ones too), so a schedule may follow any of
    them. ignite's first call only applies the initial LR: N epochs give N - 1 decays.
    """
    scheduler = LRScheduler(StepLR(optimizer, step_size=step_every_epochs, gamma=gamma))
    return scheduler, "trainer", Events.EPOCH_COMPLETED
