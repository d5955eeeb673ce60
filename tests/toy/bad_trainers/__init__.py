"""Trainers whose prep_batch gets the contract wrong, one module each (``main_runner`` names a
module exposing ``Trainer``), to see how each mistake is reported."""
