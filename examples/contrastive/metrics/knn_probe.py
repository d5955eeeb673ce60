"""kNN probe accuracy: label each query by its nearest neighbours in an encoded bank."""

import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce
from torch.nn import functional as F

from gatle_ignite import get_value


class KNNProbeAccuracy(Metric):
    """Weighted kNN accuracy of ``(features, labels)`` against ``bank_fn()``'s bank.

    ``bank_fn`` returns ``(bank_features, bank_labels)``. It is called once per evaluation pass,
    on the first update, so the bank is encoded with the weights being evaluated. Each of the
    ``k`` nearest neighbours (by cosine similarity) votes for its label with ``exp(sim / T)``.
    """

    def __init__(self, bank_fn, k=20, temperature=0.1, output_transform=lambda x: x, device="cpu"):
        self.bank_fn = bank_fn
        self.k = k
        self.temperature = temperature
        super().__init__(output_transform=output_transform, device=device)

    @reinit__is_reduced
    def reset(self):
        self._hits = torch.tensor(0.0, device=self._device)
        self._total = torch.tensor(0.0, device=self._device)
        self._bank = None

    @reinit__is_reduced
    def update(self, output):
        features, labels = (t.detach() for t in output)
        if self._bank is None:
            bank_features, bank_labels = self.bank_fn()
            self._bank = F.normalize(bank_features.float(), dim=1), bank_labels
        bank_features, bank_labels = self._bank
        sim = F.normalize(features.float(), dim=1) @ bank_features.T
        top_sim, top_idx = sim.topk(min(self.k, sim.shape[1]), dim=1)
        n_classes = int(bank_labels.max()) + 1
        votes = torch.zeros(len(labels), n_classes, device=sim.device)
        votes.scatter_add_(1, bank_labels[top_idx], (top_sim / self.temperature).exp())
        self._hits += (votes.argmax(dim=1) == labels).sum().to(self._device)
        self._total += len(labels)

    @sync_all_reduce("_hits", "_total")
    def compute(self):
        if self._total == 0:
            raise NotComputableError("KNNProbeAccuracy needs at least one query before compute()")
        return (self._hits / self._total).item()


def build_metric(bank_fn, src_name="h1", k=20, temperature=0.1):
    """A probe reading ``y_pred[src_name]`` and ``target["targets"]["labels"]``."""

    def output_transform(output):
        features = get_value(output["y_pred"], src_name)
        return features, get_value(output["target"], ("targets", "labels"))

    return KNNProbeAccuracy(bank_fn, k, temperature, output_transform=output_transform)
