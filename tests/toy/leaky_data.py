"""A remote dataset whose fetch fails with an error quoting its URL, credentials included (its
userinfo and a presigned URL's signature)."""

from torch.utils.data import Dataset

from gatle_ignite import build_dataloader

URL = (
    "https://alice:LEAK-dataset-pw@data.invalid/shard-0.tar"
    "?X-Amz-Date=20250101&X-Amz-Signature=LEAK-dataset-sig"
)


class RemoteShards(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index):
        raise OSError(f"cannot fetch {URL}: connection reset by peer")


def get_ds(ds_params, transform=None):
    return build_dataloader(RemoteShards(), ds_params), {"length": 32, "num_classes": 3}
