"""prep_batch passes the image as ``img``, which a ``transformers`` model does not name."""

from tests.toy.image_trainer import Trainer as ImageTrainer


class Trainer(ImageTrainer):
    KEY = "img"
