"""The CUDA benchmark's run: a launch-bound MLP (the GPU waits on the host, so every host
read and every microsecond of framework Python shows), bf16 autocast, data on the GPU."""

from bench.tasks.synthetic_bench import get_config as bench_config

SIZES = {"in_dim": 256, "width": 1024, "depth": 8, "n_classes": 100}
SAMPLES = 65536
BATCH = 256
EPOCHS = 6


def get_config():
    cfg = bench_config()
    cfg.name = "cuda_bench"
    cfg.model_name = "bench.tasks.wide_mlp"
    cfg.model_params = dict(SIZES)
    cfg.train_ds_name = "bench.tasks.device_data"
    cfg.train_ds_params = {
        "n": SAMPLES,
        "in_dim": SIZES["in_dim"],
        "n_classes": SIZES["n_classes"],
        "bs": BATCH,
        "shuffle": True,
        "drop_last": True,
    }
    cfg.valid_ds_name = None
    cfg.every_val = 0
    cfg.score_name = None
    cfg.save_ckpt = False
    cfg.logger_name = []
    cfg.amp_dtype = "bf16"
    cfg.max_epochs = EPOCHS
    return cfg
