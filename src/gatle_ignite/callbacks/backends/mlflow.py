"""An MLflow run in experiment ``cfg.project_name``, at MLflow's own tracking URI."""

import numbers
import re
import time

from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.callbacks.logging import import_extra
from gatle_ignite.callbacks.run_record import config_payload, flat_params, redact_text

__all__ = ["Backend"]

# The param-value limit of older MLflow servers; longer values are cut (config.json has them).
MAX_PARAM_LENGTH = 500
# Characters MLflow refuses in a param or metric name; one of them would sink the whole batch.
_BAD_NAME = re.compile(r"[^\w\-./ :]")


def _name(name: str) -> str:
    return _BAD_NAME.sub("_", name)


class Backend(BaseBackend):
    """Params from the flattened, redacted config; metrics at their step (else the epoch).

    The tracking URI is whatever MLflow resolves (``MLFLOW_TRACKING_URI``, ...). Once the run
    exists, a failing tracking server is reported and training goes on.
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        mlflow = import_extra("mlflow", "mlflow")
        self._metric = mlflow.entities.Metric
        self.client = mlflow.tracking.MlflowClient()
        experiment = self.client.get_experiment_by_name(cfg.project_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(cfg.project_name)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=cfg.name).info.run_id
        params = [
            mlflow.entities.Param(_name(name), value[:MAX_PARAM_LENGTH])
            for name, value in flat_params(config_payload(cfg)).items()
        ]
        self.client.log_batch(self.run_id, params=params)

    def log(self, metrics, step=None, epoch=None):
        at = step if step is not None else epoch
        now = int(time.time() * 1000)
        batch = [
            self._metric(_name(name), float(value), now, at or 0)
            for name, value in metrics.items()
            if isinstance(value, numbers.Real)
        ]
        if not batch:
            return
        try:
            self.client.log_batch(self.run_id, metrics=batch)
        except Exception as err:
            # The message may quote a tracking URI that carries credentials.
            print(f"[mlflow] failed to log: {redact_text(str(err))}")

    def finish(self, failed=False):
        try:
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
        except Exception as err:
            print(f"[mlflow] failed to close the run: {redact_text(str(err))}")
