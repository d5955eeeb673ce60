"""A GPT-2 from transformers, built from a config (random weights, nothing downloaded)."""

from transformers import GPT2Config, GPT2LMHeadModel


def Model(**params):
    return GPT2LMHeadModel(GPT2Config(**params))
