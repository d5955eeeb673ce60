"""Noisy 1x32x32 images of five shapes, drawn from a seeded generator."""

import torch

CLASS_NAMES = ("square", "circle", "ring", "hbar", "vbar")
TRAIN_COUNTS = (600, 300, 150, 60, 30)
EVAL_COUNTS = (100,) * 5
DEPLOY_COUNTS = (400, 200, 100, 40, 20)
SIZE = 32


def _mask(label, dy, dx, radius):
    """Where shape ``label`` of ``radius`` covers a pixel, given its offsets from the centre."""
    name = CLASS_NAMES[label]
    if name == "square":
        return (dy.abs() <= radius) & (dx.abs() <= radius)
    dist = (dy**2 + dx**2).sqrt()
    if name == "circle":
        return dist <= radius
    if name == "ring":
        return (dist <= radius) & (dist >= radius - 1.5)
    if name == "hbar":
        return (dy.abs() <= 1) & (dx.abs() <= radius)
    return (dx.abs() <= 1) & (dy.abs() <= radius)


def draw(label, gen, noise=0.45):
    """One image of class ``label``: a shape at a random place, size and brightness, plus noise."""
    cy, cx = torch.randint(10, 23, (2,), generator=gen).tolist()
    radius = int(torch.randint(3, 7, (1,), generator=gen))
    intensity = 0.5 + 0.3 * float(torch.rand(1, generator=gen))
    grid = torch.arange(SIZE, dtype=torch.float32)
    dy, dx = grid.view(-1, 1) - cy, grid.view(1, -1) - cx
    image = _mask(label, dy, dx, radius).float() * intensity
    image = image + noise * torch.randn(SIZE, SIZE, generator=gen)
    return image.unsqueeze(0)


def make_split(class_counts, seed, noise=0.45):
    """``(images, labels)`` with ``class_counts[c]`` images of class ``c``, shuffled once."""
    gen = torch.Generator().manual_seed(seed)
    images, labels = [], []
    for label, count in enumerate(class_counts):
        images += [draw(label, gen, noise) for _ in range(count)]
        labels += [label] * count
    order = torch.randperm(len(labels), generator=gen)
    return torch.stack(images)[order], torch.tensor(labels)[order]
