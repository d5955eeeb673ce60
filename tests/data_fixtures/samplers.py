"""A ``get_sampler`` giving a fixed, optionally reversed, order."""

from torch.utils.data import Sampler


class FixedOrderSampler(Sampler):
    def __init__(self, length: int, reverse: bool) -> None:
        super().__init__()
        self.order = list(range(length))[::-1] if reverse else list(range(length))

    def __iter__(self):
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def get_sampler(dataset, reverse: bool = False) -> FixedOrderSampler:
    return FixedOrderSampler(len(dataset), reverse)
