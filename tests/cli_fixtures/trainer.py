"""A stand-in ``Trainer`` that records how the launcher drove it instead of training."""

CALLS = []


class Trainer:
    def __init__(self, local_rank, cfg):
        self.local_rank = local_rank
        self.cfg = cfg

    def fit(self):
        CALLS.append(("fit", self.local_rank, self.cfg))
        print(f"fixture fit: max_epochs={self.cfg.max_epochs}")
        return self

    def evaluate(self):
        CALLS.append(("evaluate", self.local_rank, self.cfg))
        print("fixture evaluate")
