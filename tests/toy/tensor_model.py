"""The toy MLP returning its logits bare instead of in a dict: a mistake the run must name."""

from tests.toy.model import Model as DictModel


class Model(DictModel):
    def forward(self, x):
        return self.net(x)
