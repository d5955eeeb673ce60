"""The config schema: every field the framework reads, with its default."""

from ml_collections import config_dict

__all__ = ["OPTIONAL_KNOWN", "REQUIRED_FIELDS", "base_config", "known_fields"]

REQUIRED_FIELDS = (
    "name",
    "save_dir",
    "main_runner",
    "model_name",
    "train_ds_name",
    "criterion_name",
    "optimizer_name",
)

# Not pre-set: their presence carries meaning (an evaluator, inference mode, ...).
OPTIONAL_KNOWN = (
    "valid_ds_name",
    "valid_ds_params",
    "test_ds_name",
    "test_ds_params",
    "run",
    "load_from_ckpt",
    "wandb_entity",
    "discord_url",
)


def base_config() -> config_dict.ConfigDict:
    """A fresh ConfigDict holding every framework field at its default."""
    placeholder = config_dict.placeholder
    cfg = config_dict.ConfigDict()

    cfg.name = placeholder(str)
    cfg.save_dir = placeholder(str)
    cfg.project_name = "gatle"
    cfg.main_runner = placeholder(str)
    cfg.seed = 42

    cfg.model_name = placeholder(str)
    cfg.model_params = {}
    # sync_bn None: SyncBatchNorm where it works (CUDA with nccl), plain BatchNorm elsewhere.
    cfg.auto_model_params = {"find_unused_parameters": False, "sync_bn": None}
    # "ddp": a whole model per rank; "fsdp": each rank holds a shard (FSDP2).
    cfg.strategy = "ddp"
    cfg.fsdp_params = {}
    # Submodule classes whose activations are recomputed in backward instead of kept.
    cfg.activation_checkpointing = []

    cfg.train_ds_name = placeholder(str)
    cfg.train_ds_params = {}
    cfg.aug_name = placeholder(str)
    cfg.aug_params = {}

    cfg.criterion_name = placeholder(str)
    cfg.criterion_params = {}

    cfg.optimizer_name = placeholder(str)
    cfg.optimizer_params = {}
    cfg.lr_scheduler = placeholder(str)
    cfg.lr_scheduler_params = {}
    cfg.grad_clip_norm = placeholder(float)
    cfg.grad_clip_value = placeholder(float)
    cfg.accum_steps = 1
    # Iterations between reads of the losses from the device; unset = 1 for one CPU process,
    # else the trainer's default.
    cfg.check_every = placeholder(int)

    cfg.max_epochs = 1
    cfg.every_val = 1
    cfg.every_test = 0
    cfg.train_length = placeholder(int)
    cfg.early_stop_patience = 0
    cfg.early_stop_after = 0
    cfg.val_length = placeholder(int)
    cfg.test_length = placeholder(int)

    cfg.amp_dtype = "auto"
    cfg.cudnn_benchmark = False
    cfg.compile = placeholder(object)
    cfg.compile_params = {}

    cfg.train_metrics = {}
    cfg.val_metrics = {}
    cfg.tester_metrics = {}
    cfg.score_name = placeholder(str)
    cfg.score_factor = 1
    # The direction in words: "max" or "min" (score_factor -1); unset = score_factor decides.
    cfg.score_mode = placeholder(str)
    cfg.tester_score_name = placeholder(str)
    cfg.tester_score_factor = 1
    cfg.tester_score_mode = placeholder(str)

    cfg.save_ckpt = True
    cfg.n_saved = 1
    cfg.resume = False
    # A fresh run may replace the run already in save_dir only when asked to.
    cfg.replace_run = False
    # Fields whose change from the run's recorded config a resume accepts (dotted names).
    cfg.accept_changes = []
    # A resumable latest_iter checkpoint every N trainer iterations; 0 = only at epoch ends.
    cfg.save_every_iters = 0
    # Write checkpoints in the background: the loop waits only for the copy to host memory.
    cfg.async_save = False
    cfg.model_checkpoint_dir = ""
    cfg.strict = True
    # gatle-ignite export: {"dynamic": {input key: [dims]}} beside the batch and what varies.
    cfg.export_params = {}

    # Count one training step's FLOPs at the start, for perf/achieved_tflops and perf/mfu.
    cfg.count_flops = True
    # torch.profiler over a few steps: True, or {"wait": 5, "warmup": 2, "active": 3}.
    cfg.profile = config_dict.FieldReference(False, field_type=object)

    cfg.logger_name = ["text"]
    # 0: results and warnings only; 1: progress lines too; 2: ignite's own INFO lines as well.
    cfg.verbosity = 1
    # Off a terminal (a log file, a pipe): seconds at least between two progress lines.
    cfg.progress_seconds = 30.0
    # Iterations between per-iteration points; unset = 100, or fewer in a short epoch.
    cfg.log_every = placeholder(int)
    cfg.watch_grad = False
    cfg.tags = []

    cfg.dist_backend = "nccl"
    cfg.nnodes = 1
    cfg.node_rank = 0
    cfg.nproc_per_node = placeholder(int)
    cfg.master_addr = placeholder(str)
    cfg.master_port = placeholder(int)
    # Seconds a collective may wait for a peer; unset = torch's default (30 min, 10 with NCCL).
    cfg.dist_timeout = placeholder(int)
    return cfg


def known_fields() -> list:
    """Every field name the framework reads: the base fields and the optional ones."""
    return sorted(set(base_config().keys()) | set(OPTIONAL_KNOWN))
