"""A ResNet from transformers, built from a config (random weights, nothing downloaded)."""

from transformers import ResNetConfig, ResNetForImageClassification


def Model(**params):
    return ResNetForImageClassification(ResNetConfig(**params))
