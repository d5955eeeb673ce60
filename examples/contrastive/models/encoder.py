"""A SimCLR-style encoder: an MLP backbone for the features, an MLP projector for the loss."""

from torch import nn
from torch.nn import functional as F


class Model(nn.Module):
    """``forward(x1, x2=None)``: features ``h`` and L2-normalised projections ``z`` per view."""

    def __init__(self, in_dim=64, hidden=256, feat_dim=128, proj_dim=32):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Linear(hidden, feat_dim),
        )
        self.projector = nn.Sequential(
            nn.Linear(feat_dim, feat_dim), nn.ReLU(), nn.Linear(feat_dim, proj_dim)
        )

    def _view(self, x):
        h = self.encoder(x)
        return h, F.normalize(self.projector(h), dim=1)

    def forward(self, x1, x2=None):
        h1, z1 = self._view(x1)
        out = {"h1": h1, "z1": z1}
        if x2 is not None:
            out["h2"], out["z2"] = self._view(x2)
        return out
