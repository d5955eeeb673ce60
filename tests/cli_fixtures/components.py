"""Every dispatch entrypoint in one module, so a config can name it for any field.

check_dispatch only resolves these names; none of the tests builds or calls them.
"""


class Model:
    def __init__(self, **model_params):
        self.params = model_params


def get_ds(ds_params, transform=None):
    return [], {"length": 0}


class Transformation:
    def __call__(self, sample):
        return sample


class Loss:
    def __init__(self, **criterion_params):
        self.crit_keys = []


def get_optimizer(model, **optimizer_params):
    return optimizer_params


def get_scheduler(cfg, train_dl, optimizer, engines, **params):
    return None, "trainer", None


def get_metric(engine_type, info, **params):
    return None


def get_sampler(dataset, **params):
    return iter(range(len(dataset)))


class Backend:
    def __init__(self, cfg):
        self.cfg = cfg

    def log(self, metrics, step=None, epoch=None):
        pass

    def watch(self, model):
        pass

    def finish(self, failed=False):
        pass
