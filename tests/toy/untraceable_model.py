"""The toy MLP whose output also holds a string: it trains, but torch cannot trace it."""

from tests.toy.model import Model as ToyModel


class Model(ToyModel):
    def forward(self, x):
        return {"logits": self.net(x), "kind": "mlp"}
