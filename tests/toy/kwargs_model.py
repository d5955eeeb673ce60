"""The toy MLP behind a forward that passes every keyword on: a wrapper as a compiled model or
a library's is, whose own signature takes anything."""

from torch import nn

from tests.toy.model import Model as ToyModel


class Model(nn.Module):
    def __init__(self, **params):
        super().__init__()
        self.inner = ToyModel(**params)

    def forward(self, **inputs):
        return self.inner(**inputs)
