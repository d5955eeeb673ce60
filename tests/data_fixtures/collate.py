"""A ``get_collate_fn`` whose collate tags each batch, so tests can see it was used."""

from torch.utils.data import default_collate


def get_collate_fn(tag: str = "default"):
    def collate(samples):
        return {"tag": tag, "batch": default_collate(samples)}

    return collate
