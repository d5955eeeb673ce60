"""The toy MLP with a forward an exporter cannot take as it is, for the export tests."""

from tests.toy.model import Model as ToyModel


class Model(ToyModel):
    """``quirk="branch"``: the output depends on a branch on the batch's values (data-dependent
    control flow); ``quirk="batch_of_16"``: a reshape that pins the batch to 16 rows."""

    def __init__(self, quirk="branch", **params):
        super().__init__(**params)
        self.quirk = quirk

    def forward(self, x):
        logits = self.net(x)
        if self.quirk == "batch_of_16":
            return {"logits": logits.reshape(16, -1)}
        if x.sum() > 0:
            return {"logits": logits}
        return {"logits": -logits}
