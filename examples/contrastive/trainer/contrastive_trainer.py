"""The contrastive trainer: two views to train on, a kNN probe against an encoded bank."""

import torch

from examples.contrastive.metrics.knn_probe import build_metric
from gatle_ignite import BaseTrainer, get_dataset, get_value, to_device


class Trainer(BaseTrainer):
    """SimCLR training; ``valid/knn`` scores the encoder's features by kNN against a bank."""

    def prep_batch(self, batch, split="train", **kwargs):
        view1, view2, labels = batch
        # Only training contrasts two views; every other split encodes one.
        model_input = {"x1": view1, "x2": view2} if split == "train" else {"x1": view1}
        return to_device({"model_input": model_input, "targets": {"labels": labels}}, self.device)

    def build_dataloaders(self):
        """The engines' loaders, plus the kNN bank, which belongs to no engine."""
        dls, infos = super().build_dataloaders()
        self.bank_dl, self.bank_info = get_dataset(
            self.cfg.bank_ds_name, self.cfg.bank_ds_params, self.transform, field="bank_ds_name"
        )
        return dls, infos

    def encode_bank(self):
        """``(features, labels)`` of the whole bank under the current weights."""
        was_training = self.model.training
        self.model.eval()
        src_name = self.cfg.knn_params["src_name"]
        features, labels = [], []
        with (
            torch.no_grad(),
            torch.autocast(
                device_type=self.device_type, dtype=self.dtype, enabled=self.autocast_enabled
            ),
        ):
            for batch in self.bank_dl:
                x = self.prep_batch(batch, split="bank")
                features.append(get_value(self.forward(x["model_input"]), src_name))
                labels.append(x["targets"]["labels"])
        if was_training:
            self.model.train()
        return torch.cat(features), torch.cat(labels)

    def dict_metric_from_list(self, engine_type, spec, dict_metrics, info=None):
        """The config's metrics (none here), plus the kNN probe on the evaluator."""
        dict_metrics = super().dict_metric_from_list(engine_type, spec, dict_metrics, info=info)
        if engine_type == "valid":
            knn = self.cfg.knn_params
            dict_metrics["valid/knn"] = build_metric(
                self.encode_bank, knn["src_name"], knn["k"], knn["temperature"]
            )
        return dict_metrics
