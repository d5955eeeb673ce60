"""Top-k accuracy: the label counts as found when it is among the k highest logits."""

import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from gatle_ignite import get_value


class TopKAccuracy(Metric):
    """Fraction of samples whose label is among the ``k`` largest logits."""

    def __init__(self, k=2, output_transform=lambda x: x, device="cpu"):
        self.k = k
        super().__init__(output_transform=output_transform, device=device)

    @reinit__is_reduced
    def reset(self):
        # Tensors, not ints, so sync_all_reduce can sum them across ranks.
        self._num_correct = torch.tensor(0, device=self._device)
        self._num_examples = torch.tensor(0, device=self._device)

    @reinit__is_reduced
    def update(self, output):
        logits, labels = output[0].detach(), output[1].detach()
        top = logits.topk(self.k, dim=1).indices
        hits = (top == labels.view(-1, 1)).any(dim=1)
        self._num_correct += hits.sum().to(self._device)
        self._num_examples += labels.numel()

    @sync_all_reduce("_num_correct", "_num_examples")
    def compute(self):
        if self._num_examples == 0:
            raise NotComputableError("TopKAccuracy needs at least one example before compute()")
        return self._num_correct.item() / self._num_examples.item()


def get_metric(engine_type, info, k=2, src_name="logits", tgt_name=("targets", "labels")):
    """Top-k accuracy, with ``k`` capped at ``info["num_classes"]`` (topk fails above it)."""
    k = min(k, info.get("num_classes", k))

    def output_transform(output):
        return get_value(output["y_pred"], src_name), get_value(output["target"], tgt_name)

    return TopKAccuracy(k=k, output_transform=output_transform)
