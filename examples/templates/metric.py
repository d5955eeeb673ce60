"""Template for ``*_metrics.<key>.cls_name``: ``get_metric(engine_type, info, **params)``."""

import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from gatle_ignite import get_value


class TopKAccuracy(Metric):
    """Share of samples whose label is among the ``k`` highest logits.

    The counts are tensors and ``compute`` is wrapped by ``sync_all_reduce``, so under DDP every
    rank's counts are summed before dividing; without it each rank would report its own shard.
    """

    # The state ignite (>= 0.5) puts in Metric.state_dict(); the same names are all-reduced.
    _state_dict_all_req_keys = ("_num_correct", "_num_examples")

    def __init__(self, k=2, output_transform=lambda x: x):
        self.k = k
        super().__init__(output_transform=output_transform)

    @reinit__is_reduced
    def reset(self):
        self._num_correct = torch.tensor(0, device=self._device)
        self._num_examples = torch.tensor(0, device=self._device)

    @reinit__is_reduced
    def update(self, output):
        logits, labels = output[0].detach(), output[1].detach()
        top = logits.topk(self.k, dim=1).indices
        correct = (top == labels.unsqueeze(1)).any(dim=1)
        self._num_correct += correct.sum().to(self._device)
        self._num_examples += correct.numel()

    @sync_all_reduce("_num_correct", "_num_examples")
    def compute(self):
        if self._num_examples == 0:
            raise NotComputableError("TopKAccuracy needs at least one sample before compute()")
        return self._num_correct.item() / self._num_examples.item()


def get_metric(engine_type, info, src_name="logits", tgt_name=("targets", "labels"), k=2):
    """Top-``k`` accuracy of ``y_pred[src_name]`` against ``target[tgt_name]``."""

    def output_transform(output):
        return get_value(output["y_pred"], src_name), get_value(output["target"], tgt_name)

    return TopKAccuracy(k=k, output_transform=output_transform)
