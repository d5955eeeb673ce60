"""Seeding: the same seed on every rank fixes the initial weights and the data order."""

import os
import random

import numpy as np
import torch

__all__ = ["setup_seed"]


def setup_seed(seed, cudnn_benchmark=False):
    """Seed Python, NumPy and torch (CUDA included) with ``seed``; set cudnn's benchmark mode."""
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.benchmark = cudnn_benchmark
