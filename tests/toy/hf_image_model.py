"""A ``transformers`` ResNet built from a config, for the tests of errors raised inside a library:
``Model(**model_params)`` passes the params to ``ResNetConfig`` as they are."""

from transformers import ResNetConfig, ResNetForImageClassification


def Model(**params):
    config = {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 3}
    return ResNetForImageClassification(ResNetConfig(**{**config, **params}))
