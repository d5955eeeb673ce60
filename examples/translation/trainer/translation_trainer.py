"""The translation trainer: train and eval differ only through ``split``."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    """Teacher forcing on the train split; every other split decodes from the source alone."""

    def prep_batch(self, batch, split="train", **kwargs):
        batch = to_device(batch, self.device)
        model_input = {"src_feats": batch["src_feats"], "src_pad_mask": batch["src_pad_mask"]}
        # Handing tgt_in to an eval split would score teacher forcing, not translation.
        if split == "train":
            model_input["tgt_in"] = batch["tgt_in"]
        return {"model_input": model_input, "targets": {"tgt_out": batch["tgt_out"]}}
