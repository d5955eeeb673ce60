"""A metric whose value per evaluation comes from a list, to script best/divergence/early stop."""

from ignite.metrics import Metric


class Scripted(Metric):
    def __init__(self, values):
        self.values = list(values)
        self.calls = 0
        super().__init__(output_transform=lambda output: (None, None))

    def reset(self):
        pass

    def update(self, output):
        pass

    def compute(self):
        value = self.values[min(self.calls, len(self.values) - 1)]
        self.calls += 1
        return value


def get_metric(engine_type, info, values=(0.5,)):
    return Scripted(values)
