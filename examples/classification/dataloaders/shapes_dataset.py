"""The shapes splits: imbalanced train, balanced valid, imbalanced test."""

from torch.utils.data import Dataset

from examples.classification.dataloaders.data_utils.shapes import (
    CLASS_NAMES,
    EVAL_COUNTS,
    TRAIN_COUNTS,
    make_split,
)
from gatle_ignite import build_dataloader


class ShapesDataset(Dataset):
    """``(image, label)`` pairs; ``transform`` is applied to the train split only."""

    def __init__(self, split, class_counts, seed, transform=None):
        self.split = split
        self.class_counts = tuple(class_counts)
        self.transform = transform
        self.images, self._labels = make_split(self.class_counts, seed)

    @property
    def labels(self):
        """Every sample's class, for the balanced sampler."""
        return self._labels

    def __len__(self):
        return len(self._labels)

    def __getitem__(self, index):
        image = self.images[index]
        # The transform is shared by every split, so the dataset decides who gets augmented.
        if self.transform is not None and self.split == "train":
            image = self.transform(image)
        return image, self._labels[index]


def get_ds(ds_params, transform=None):
    """Build one split; its class counts default by split (imbalanced train, balanced eval)."""
    split = ds_params.get("split", "train")
    default_counts = TRAIN_COUNTS if split == "train" else EVAL_COUNTS
    class_counts = tuple(ds_params.get("class_counts", default_counts))
    ds = ShapesDataset(split, class_counts, ds_params.get("seed", 0), transform=transform)
    info = {
        "length": len(ds),
        "num_classes": len(CLASS_NAMES),
        "class_names": CLASS_NAMES,
        "class_counts": class_counts,
    }
    return build_dataloader(ds, ds_params), info
