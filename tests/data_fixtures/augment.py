"""A ``Transformation`` that scales its input."""


class Transformation:
    def __init__(self, scale: int = 1) -> None:
        self.scale = scale

    def __call__(self, x):
        return x * self.scale
