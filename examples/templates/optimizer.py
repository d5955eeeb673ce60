"""Template for ``optimizer_name``: ``get_optimizer(model, **optimizer_params)``."""

import ignite.distributed as idist
import torch


def get_optimizer(model, lr=1e-3, weight_decay=0.0, no_decay_on_norm_and_bias=True, **kw):
    """AdamW; biases and norm weights (1-d parameters) are left out of weight decay."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if weight_decay and no_decay_on_norm_and_bias:
        decay = [p for name, p in params if p.ndim > 1 and not name.endswith(".bias")]
        no_decay = [p for name, p in params if p.ndim <= 1 or name.endswith(".bias")]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": [p for _, p in params], "weight_decay": weight_decay}]
    # A no-op for one process and native DDP; other idist backends wrap the optimizer.
    return idist.auto_optim(torch.optim.AdamW(groups, lr=lr, **kw))
