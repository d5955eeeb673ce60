"""Two views of each sample: shared class content, independent nuisance style.

A view is ``mixing @ [content, style] + noise``. The content carries the label; the style is four
times larger and differs between the two views, so raw inputs are poor kNN features and an
encoder has to learn to discard the style.
"""

import torch
from torch.utils.data import DataLoader, Dataset

from gatle_ignite import build_dataloader

TASK_SEED = 1234
NOISE_STD = 0.05


class Mixer:
    """Batch collate turning drawn factors into ``(view1, view2, labels)``.

    A class rather than a closure so it pickles into worker processes. It draws nothing: the same
    collate serves the training split, the validation split and the bank, so a draw here would
    make the evaluation views change on every pass.
    """

    def __init__(self, mixing, noise_std=NOISE_STD):
        self.mixing = mixing
        self.noise_std = noise_std

    def observe(self, content, style, noise):
        """One observation per row of the factors."""
        return torch.cat([content, style], dim=1) @ self.mixing.T + self.noise_std * noise

    def __call__(self, items):
        content, style1, style2, noise1, noise2, labels = (torch.stack(f) for f in zip(*items))
        view1 = self.observe(content, style1, noise1)
        view2 = self.observe(content, style2, noise2)
        return view1, view2, labels


class TwoViewDataset(Dataset):
    """``(content, style1, style2, noise1, noise2, label)`` per sample.

    With ``stochastic_views`` the styles and noise are redrawn on every access (this task's
    augmentation); otherwise they are drawn once, so an evaluation split is fixed. The generator
    lives in the process: with ``num_workers > 0`` each worker would replay the same draws.
    """

    def __init__(
        self,
        n=1024,
        seed=0,
        n_classes=10,
        d_content=16,
        d_style=16,
        obs_dim=64,
        proto_scale=1.0,
        content_sigma=0.5,
        style_scale=4.0,
        stochastic_views=False,
        task_seed=TASK_SEED,
    ):
        # The prototypes and the mixing come from the task's generator, the samples from the
        # split's: every split then shares one task.
        task_gen = torch.Generator().manual_seed(task_seed)
        prototypes = proto_scale * torch.randn(n_classes, d_content, generator=task_gen)
        mixing = torch.randn(obs_dim, d_content + d_style, generator=task_gen)
        self.mixer = Mixer(mixing / (d_content + d_style) ** 0.5)

        self.gen = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(n_classes, (n,), generator=self.gen)
        noise = torch.randn(n, d_content, generator=self.gen)
        self.content = prototypes[self.labels] + content_sigma * noise
        self.d_style = d_style
        self.obs_dim = obs_dim
        self.style_scale = style_scale
        self.stochastic_views = stochastic_views
        if not stochastic_views:
            self.views = [self._draw_view(n) for _ in range(2)]

    def _draw_view(self, *batch):
        style = self.style_scale * torch.randn(*batch, self.d_style, generator=self.gen)
        return style, torch.randn(*batch, self.obs_dim, generator=self.gen)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.stochastic_views:
            (style1, noise1), (style2, noise2) = self._draw_view(), self._draw_view()
        else:
            (style1, noise1), (style2, noise2) = ((s[i], e[i]) for s, e in self.views)
        return self.content[i], style1, style2, noise1, noise2, self.labels[i]


def get_ds(ds_params, transform=None):
    """One split; ``shard=False`` gives every rank the whole split (the kNN bank)."""
    ds = TwoViewDataset(
        n=ds_params.get("n", 1024),
        seed=ds_params.get("seed", 0),
        n_classes=ds_params.get("n_classes", 10),
        d_content=ds_params.get("d_content", 16),
        d_style=ds_params.get("d_style", 16),
        obs_dim=ds_params.get("obs_dim", 64),
        proto_scale=ds_params.get("proto_scale", 1.0),
        content_sigma=ds_params.get("content_sigma", 0.5),
        style_scale=ds_params.get("style_scale", 4.0),
        stochastic_views=ds_params.get("stochastic_views", False),
        task_seed=ds_params.get("task_seed", TASK_SEED),
    )
    info = {"length": len(ds), "num_classes": ds_params.get("n_classes", 10)}
    if ds_params.get("shard", True):
        loader = build_dataloader(ds, {**ds_params, "collate_fn": ds.mixer})
    else:
        loader = DataLoader(
            ds,
            batch_size=ds_params.get("bs", 256),
            num_workers=ds_params.get("num_workers", 0),
            collate_fn=ds.mixer,
        )
    return loader, info
