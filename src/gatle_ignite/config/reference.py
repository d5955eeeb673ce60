"""What every config field means, in words: the source of the documentation's config reference.

``FIELD_DOCS`` holds one sentence or two for every field of :func:`gatle_ignite.base_config`
and every name in ``OPTIONAL_KNOWN``; the documentation build reads the defaults from
``base_config()`` itself and fails when a field has no entry here, or an entry names no field.
``FIELD_GROUPS`` orders the fields into the sections the reference shows.

Nothing in the framework imports this module at run time.
"""

__all__ = [
    "DS_PARAMS_DOCS",
    "FIELD_DOCS",
    "FIELD_GROUPS",
    "LOSS_ENTRY_DOCS",
    "UNDECLARED_FIELD_DOCS",
]

FIELD_DOCS: dict[str, str] = {
    # ---- identity and wiring ----
    "name": (
        "Identifies the run: the W&B run id and name, the MLflow run name and the Discord "
        "embed title. By convention the config file's stem (`Path(__file__).stem`)."
    ),
    "save_dir": (
        "Directory the run writes into (checkpoints, `config.json`, `metrics.csv`, "
        "`tensorboard/`) and where `resume` and `gatle-ignite eval` look. Used as given: no "
        "per-run sub-directory is added."
    ),
    "project_name": "The W&B project and the MLflow experiment. The text logger ignores it.",
    "main_runner": (
        "Dotted path of the module exposing `Trainer`, your `BaseTrainer` subclass; the "
        "launcher builds `Trainer(local_rank, cfg)` and calls `fit()` or `evaluate()`."
    ),
    "seed": (
        "Seeds Python, NumPy and torch when the trainer is built, with the same value on every "
        "rank, so it fixes the initial weights."
    ),
    # ---- model ----
    "model_name": "Dotted path of the module exposing `Model`.",
    "model_params": "Keyword arguments of `Model(**model_params)`.",
    "auto_model_params": (
        "Keyword arguments of `idist.auto_model`, the DDP wrap, used only when more than one "
        "process runs. `sync_bn` converts BatchNorm to SyncBatchNorm, which works only on CUDA "
        "with nccl: unset (None, the default) it converts there and keeps plain BatchNorm "
        "elsewhere (saying so in one line); True where it cannot work is a config error; False "
        "never converts."
    ),
    "strategy": (
        "How the model is spread over the ranks: `ddp` (a whole copy per rank, the default) or "
        "`fsdp` (FSDP2: each rank holds a shard of the parameters, gradients and optimizer "
        "state; checkpoints become sharded `.dcp` directories). With one process nothing is "
        "sharded, but checkpoints keep the `.dcp` format."
    ),
    "fsdp_params": (
        "For `strategy = 'fsdp'`: `wrap` (submodule class names or dotted class paths sharded as "
        "units, e.g. `['Block']`), `reshard_after_forward` (default True), `param_dtype` / "
        "`reduce_dtype` (`bf16`, `fp16`, `fp32`; default: the AMP dtype and fp32 when AMP is on) "
        "and `cpu_offload` (default False)."
    ),
    "activation_checkpointing": (
        "Submodule class names (or dotted class paths) whose activations are recomputed in "
        "backward instead of kept: less memory, about one more forward of compute. Works with "
        "either strategy."
    ),
    # ---- data ----
    "train_ds_name": "Dotted path of the module exposing `get_ds` for the training split.",
    "train_ds_params": (
        "Passed to the training `get_ds`. Holds the total batch size `bs` and the other "
        "loader keys `build_dataloader` reads; every other key is the dataset's own."
    ),
    "aug_name": (
        "Optional dotted path of a module exposing `Transformation`. Built once and handed to "
        "every split's `get_ds` as `transform`; the dataset decides where to apply it."
    ),
    "aug_params": "Keyword arguments of `Transformation(**aug_params)`.",
    "valid_ds_name": (
        "Dotted path (exposing `get_ds`) of the validation split. Not set, or empty: no "
        "evaluator is built, so no `valid/*` metric and no best checkpoint."
    ),
    "valid_ds_params": (
        "Passed to the validation `get_ds`; `exact_sharding` defaults to True for it."
    ),
    "test_ds_name": (
        "Dotted path of the test split's `get_ds`. Not set: no tester is built. It runs every "
        "`every_test` epochs during training, and always under `gatle-ignite eval`."
    ),
    "test_ds_params": "Passed to the test `get_ds`; `exact_sharding` defaults to True for it.",
    # ---- loss ----
    "criterion_name": (
        "Dotted path of the module exposing `Loss`, the whole criterion: one loss "
        "(`gatle_ignite.losses.cross_entropy`, any built-in below, or your own term), logged as "
        "`train/loss_avg` alone; or `gatle_ignite.losses.composite`, a weighted, gated sum of "
        "terms, each also logged as `train/loss_<key>_avg`."
    ),
    "criterion_params": (
        "Keyword arguments of `Loss(**criterion_params)`: for a built-in loss `src_name`, "
        "`tgt_name` and the torch loss's own (`ignore_index`, `label_smoothing`, ...); for the "
        "composite, `{'dict_of_loss_params': {<key>: {'cls_name', 'weight', 'loss_params'}}}`."
    ),
    # ---- optimizer and schedule ----
    "optimizer_name": (
        "Dotted path of the module exposing `get_optimizer`. Built-ins are named in full "
        "(`gatle_ignite.optimizers.adamw`); a bare `adamw` does not resolve."
    ),
    "optimizer_params": (
        "Keyword arguments of `get_optimizer(model, **optimizer_params)`. The built-in "
        "schedulers read the base learning rate `lr` from here."
    ),
    "lr_scheduler": (
        "Dotted path of the module exposing `get_scheduler`, e.g. "
        "`gatle_ignite.schedulers.warmup_cosine`. Not set: the learning rate stays constant."
    ),
    "lr_scheduler_params": (
        "Keyword arguments added to `get_scheduler(cfg, train_dl, optimizer, engines, ...)`; "
        "one it does not accept is a config error."
    ),
    "grad_clip_norm": (
        "Clip gradients to this total L2 norm before each optimizer step; unset = off."
    ),
    "grad_clip_value": (
        "Clip each gradient element to +/- this value before each step; unset = off."
    ),
    "accum_steps": (
        "Gradient accumulation: micro-batches per optimizer step. Each micro-batch's loss is "
        "divided by the window; clipping applies to the accumulated gradient; windows never "
        "cross an epoch's end."
    ),
    "check_every": (
        "Iterations between reads of the losses from the device (and, under DDP, the all-reduce "
        "that makes ranks agree on a non-finite loss or a preemption). Between reads no step "
        "waits for the device. A non-finite loss is still reported at the exact iteration it "
        "appeared, and a read is forced before anything is saved, evaluated or logged. Unset: 1 "
        "for one process on the CPU, where a read is free, else 64, plus a read at each "
        "progress line (ten an epoch) so that its loss is current; set, a progress line between "
        "reads shows the last loss read with its iteration."
    ),
    # ---- training loop ----
    "max_epochs": (
        "Training epochs. It also fixes the length of the built-in LR schedules, so keep it "
        "unchanged when resuming."
    ),
    "every_val": "Run the evaluator every N epochs; 0 builds no evaluator.",
    "every_test": (
        "Run the tester every N epochs during training; 0, the default, never runs it while "
        "training."
    ),
    "train_length": (
        "Iterations per training epoch; unset = one pass over the loader. Must not change "
        "across a resume."
    ),
    "val_length": "Iterations per evaluator run; unset = the whole validation loader.",
    "test_length": "Iterations per tester run; unset = the whole test loader.",
    "early_stop_patience": (
        "Stop after this many evaluator runs in a row without an improvement of "
        "`score_name` (times `score_factor`); 0 = never stop early."
    ),
    "early_stop_after": (
        "Trainer epochs to wait before early stopping starts counting: evaluations at an "
        "earlier epoch are ignored."
    ),
    # ---- precision and speed ----
    "amp_dtype": (
        "Autocast precision: `auto` (bf16 on a CUDA device that supports it, else fp32), "
        "`bf16`, `fp16` (CUDA only, with a GradScaler) or `fp32` (autocast off)."
    ),
    "cudnn_benchmark": "Sets `torch.backends.cudnn.benchmark` when the trainer is built.",
    "compile": (
        "`torch.compile` for the model, in place and before any DDP wrap: True, False, "
        "`'auto'` (only on an accelerator, and only where dynamo would not skip the model) or "
        "unset (off). Checkpoints are the same with and without it."
    ),
    "compile_params": (
        "Keyword arguments of `nn.Module.compile()` (`mode`, `dynamic`, `backend`, "
        "`fullgraph`, ...), passed through unchecked."
    ),
    # ---- metrics and scoring ----
    "train_metrics": (
        "`{key: {'cls_name': <module with get_metric>, 'params': {...}}}` computed on the "
        "trainer and logged as `train/<key>`. Loss averages are added on their own."
    ),
    "val_metrics": "The same mapping for the evaluator, logged as `valid/<key>`.",
    "tester_metrics": "The same mapping for the tester, logged as `test/<key>`.",
    "score_name": (
        "The evaluator metric that selects the best checkpoint, as a full key (`valid/acc`). "
        "Unset: only `latest` checkpoints are written. A non-finite score ends the run."
    ),
    "score_factor": (
        "Multiplies the score. The best checkpoint keeps the maximum, so use -1 when lower is "
        "better (a loss, an error rate), or say it with `score_mode`. The best files are named "
        "after factor x value; `status`, `runs`, the summary, the sweep and `plot` show the "
        "metric's own value and say `lower is better`."
    ),
    "score_mode": (
        "The score's direction in words: `'max'` (higher is better) or `'min'` (lower is "
        "better, the same as `score_factor = -1`, which it sets). `'min'` needs `score_factor` "
        "left at its default (not set in the config or an override) or set negative; a factor "
        "the config sets to the other direction (1 for `'min'`, -1 for `'max'`) is a config "
        "error. Unset: `score_factor` decides."
    ),
    "tester_score_name": (
        "A tester metric (`test/acc`) that selects its own `test_best_result*` checkpoints. "
        "`gatle-ignite eval --ckpt best` never picks those."
    ),
    "tester_score_factor": "`score_factor` for `tester_score_name`.",
    "tester_score_mode": "`score_mode` for `tester_score_name`.",
    # ---- checkpoints and resume ----
    "save_ckpt": (
        "Write checkpoints at all. False: nothing is saved, not even at preemption (a "
        "non-finite score still ends the run)."
    ),
    "n_saved": (
        "How many files of each kind (latest, each best) to keep: an int >= 1, or None for "
        "all. Only files this process wrote are rotated out; older ones stay."
    ),
    "resume": (
        "Continue from the newest `latest_epoch*` or `latest_iter*` checkpoint in `save_dir`, "
        "with the optimizer, schedule, epoch, position in the data and random state. Without "
        "one it warns and starts fresh, so it is safe to leave on."
    ),
    "replace_run": (
        "A fresh run (`resume=False`) into a `save_dir` that holds another run's checkpoints is "
        "refused unless this is True; then that run's checkpoints, `run.json`, `config.json`, "
        "`metrics.csv`, `tensorboard/` and `profile/` are deleted first. Files the framework "
        "did not write stay."
    ),
    "accept_changes": (
        "Dotted field names (`optimizer_params.lr`, or a whole `model_params`) whose change from "
        "the run's recorded config a resume accepts, and makes take effect (a new learning "
        "rate goes into the optimizer and the schedule). Any other change to what defines the "
        "run is refused."
    ),
    "async_save": (
        "Write checkpoints in the background: the loop waits only for the state's copy to host "
        "memory (sharded ones through DCP's async save). The next save, a preemption and the "
        "end of the run wait for a pending write; a crash mid-write leaves the previous "
        "checkpoint intact."
    ),
    "save_every_iters": (
        "Also write a resumable `latest_iter_checkpoint_<iteration>.pt` every N trainer "
        "iterations, mid-epoch; 0 = only at epoch ends. Rotated by `n_saved` like the others."
    ),
    "model_checkpoint_dir": (
        "A checkpoint file (despite the name) to load the model's weights from before "
        "training: a warm start or fine-tune, with a fresh optimizer at epoch 0."
    ),
    "strict": (
        "`strict=` for the `model_checkpoint_dir` load and for the model load of "
        "`gatle-ignite eval`."
    ),
    "export_params": (
        "For `gatle-ignite export`: `dynamic`, a mapping of `model_input` keys to the "
        'dimensions to make dynamic (`{"input_ids": [0, 1]}`), beside the batch and the '
        "dimensions that vary between the batches export samples; `--dynamic KEY=DIM,...` adds "
        "more. Never changes what a run trains."
    ),
    "run": (
        "Inference mode, set by `gatle-ignite eval`: its presence, whatever its value (even "
        "False), makes the launcher load a checkpoint and evaluate, never train or write."
    ),
    "load_from_ckpt": (
        "Which checkpoint inference mode loads: `best` (the highest `valid_best_result*`, "
        "the default) or `latest`; `--ckpt` sets it."
    ),
    # ---- telemetry and profiling ----
    "count_flops": (
        "Count one training step's FLOPs (forward and backward, this rank's share of the batch) "
        "once, on the run's first batch, with `torch.utils.flop_counter`, for "
        "`perf/achieved_tflops` and, on a GPU whose peak is known, `perf/mfu`. The counting "
        "step changes no weight, gradient, buffer or random stream; a model it cannot count "
        "only loses those figures (one warning)."
    ),
    "profile": (
        "`torch.profiler` over a few training steps: False (off), True (wait 5 steps, warm up "
        "2, record 3) or a mapping of `wait` / `warmup` / `active` step counts. Each rank writes "
        "a Chrome trace to `<save_dir>/profile/` (Perfetto, TensorBoard's profiler plugin) and "
        "rank 0 prints the top operators by self time. `train --profile` sets True."
    ),
    # ---- logging ----
    "logger_name": (
        "The sinks, in order: the built-in short names `text`, `csv`, `tensorboard`, `mlflow`, "
        "`wandb`, `discord`, dotted paths of your own backend modules, and the flag `pbar` "
        "(tqdm bars instead of text progress lines)."
    ),
    "log_every": (
        "Trainer iterations between per-iteration points: the learning rate of each param group "
        "(`train/lr_<group>`), the loss (`train/loss`) and, with `watch_grad`, the gradient "
        "norm. Unset (the default): a twentieth of an epoch, at least 1 and at most 100, so a "
        "short run still draws its schedule."
    ),
    "verbosity": (
        "What a run prints: 0 the results, warnings and errors (and the early-stopping "
        "lines); 1 (default) also the progress lines; 2 also ignite's own INFO lines (loader "
        "settings, the DDP wrap, EarlyStopping's own `Stop training`)."
    ),
    "progress_seconds": (
        "Off a terminal (output to a log file or a pipe), the seconds at least between two "
        "training or evaluation progress lines; the first comes once this long has passed. "
        "The epoch blocks are printed whatever it says. 0: the ten lines per epoch a "
        "terminal gets."
    ),
    "watch_grad": (
        "Log the global gradient norm (`train/grad_norm`) every `log_every` iterations and "
        "call each backend's `watch(model)` once."
    ),
    "tags": "Tags for the W&B run.",
    "wandb_entity": "The W&B entity (team or user); not set = your default entity.",
    "discord_url": (
        "The Discord webhook. Prefer the `DISCORD_WEBHOOK_URL` environment variable: a "
        "credential does not belong in a config (it is redacted from every record)."
    ),
    # ---- distributed ----
    "dist_backend": (
        "`torch.distributed` backend when more than one process runs; `nccl` falls back to "
        "`gloo` without CUDA."
    ),
    "nnodes": "Number of machines gatle-ignite spawns ranks on.",
    "node_rank": (
        "This machine's index, 0 to `nnodes - 1`; each node runs the same command with its own."
    ),
    "nproc_per_node": (
        "Processes (ranks) per machine; unset = the number of visible GPUs, or 1 without one."
    ),
    "master_addr": (
        "Rendezvous host: node 0's address. Unset: `MASTER_ADDR`, else `127.0.0.1`, which is "
        "refused when `nnodes > 1`."
    ),
    "master_port": (
        "Rendezvous port. Unset: `MASTER_PORT`, else a random free port in 49152-65535 (one "
        "node only); `nnodes > 1` needs the same port on every node."
    ),
    "dist_timeout": (
        "Seconds a collective waits for a stalled or dead peer before the whole run fails with "
        "a message naming this timeout (exit code 69); unset = torch's default (30 minutes, "
        "10 with NCCL)."
    ),
}

# Sections of the config reference, in order; together they hold every key of FIELD_DOCS once.
FIELD_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Identity and wiring", ("name", "save_dir", "project_name", "main_runner", "seed")),
    (
        "Model",
        (
            "model_name",
            "model_params",
            "auto_model_params",
            "strategy",
            "fsdp_params",
            "activation_checkpointing",
        ),
    ),
    (
        "Data",
        (
            "train_ds_name",
            "train_ds_params",
            "valid_ds_name",
            "valid_ds_params",
            "test_ds_name",
            "test_ds_params",
            "aug_name",
            "aug_params",
        ),
    ),
    ("Loss", ("criterion_name", "criterion_params")),
    (
        "Optimizer and schedule",
        (
            "optimizer_name",
            "optimizer_params",
            "lr_scheduler",
            "lr_scheduler_params",
            "grad_clip_norm",
            "grad_clip_value",
            "accum_steps",
            "check_every",
        ),
    ),
    (
        "Training loop",
        (
            "max_epochs",
            "every_val",
            "every_test",
            "train_length",
            "val_length",
            "test_length",
            "early_stop_patience",
            "early_stop_after",
        ),
    ),
    ("Precision and speed", ("amp_dtype", "cudnn_benchmark", "compile", "compile_params")),
    (
        "Metrics and scoring",
        (
            "train_metrics",
            "val_metrics",
            "tester_metrics",
            "score_name",
            "score_factor",
            "score_mode",
            "tester_score_name",
            "tester_score_factor",
            "tester_score_mode",
        ),
    ),
    (
        "Checkpoints, resume and evaluation",
        (
            "save_ckpt",
            "n_saved",
            "resume",
            "replace_run",
            "accept_changes",
            "save_every_iters",
            "async_save",
            "model_checkpoint_dir",
            "strict",
            "run",
            "load_from_ckpt",
            "export_params",
        ),
    ),
    ("Telemetry and profiling", ("count_flops", "profile")),
    (
        "Logging",
        (
            "logger_name",
            "log_every",
            "verbosity",
            "progress_seconds",
            "watch_grad",
            "tags",
            "wandb_entity",
            "discord_url",
        ),
    ),
    (
        "Distributed",
        (
            "dist_backend",
            "nnodes",
            "node_rank",
            "nproc_per_node",
            "master_addr",
            "master_port",
            "dist_timeout",
        ),
    ),
)

# Read by the framework but declared nowhere (base_config() does not set them).
UNDECLARED_FIELD_DOCS: dict[str, str] = {
    "discord_username": "The name the Discord backend posts as; default `gatle`.",
    "<name>_ds_name / <name>_ds_params": (
        "The data of an engine a trainer declares with `EngineSpec.for_split(name)`, unless "
        "its `ds_prefix` shares another split's loader."
    ),
    "<name>_metrics": "That engine's metric mapping, logged as `<name>/<key>`.",
    "every_<name>": (
        "That engine's cadence in epochs; required once the engine is declared (0 = off)."
    ),
    "<name>_length": "Iterations per run of that engine; unset = the whole loader.",
    "<name>_score_name / <name>_score_factor / <name>_score_mode": (
        "A metric of that engine selecting `<name>_best_result*` checkpoints, its factor, and "
        "its direction in words (`max` or `min`)."
    ),
    "<name>_early_stop_patience / <name>_early_stop_after": (
        "Early stopping on that engine's score, as for the evaluator."
    ),
}

# The keys of a *_ds_params mapping that gatle_ignite.build_dataloader reads.
DS_PARAMS_DOCS: dict[str, str] = {
    "bs": "The TOTAL batch size across all ranks, on every split (default 1).",
    "num_workers": "DataLoader workers (default 0); divided among a node's ranks.",
    "shuffle": "Shuffle the order (default False); ignored, with a warning, when a sampler is set.",
    "drop_last": "Drop the last incomplete batch (default False; never done for eval splits).",
    "pin_memory": "Pin host memory (default: whether CUDA is available).",
    "collate_fn": ("A callable, or `{'cls_name': <module with get_collate_fn>, 'params': {...}}`."),
    "sampler_params": "`{'cls_name': <module with get_sampler>, 'params': {...}}`.",
    "exact_sharding": (
        "Shard the split into contiguous, unpadded blocks across ranks, so metrics equal the "
        "one-process value (default True for eval splits, False for training)."
    ),
}

# The keys of one entry of gatle_ignite.losses.composite's dict_of_loss_params.
LOSS_ENTRY_DOCS: dict[str, str] = {
    "cls_name": "Dotted path of the module exposing the term's `Loss` (required).",
    "weight": (
        "The term's weight in the total (required; 0.0 still computes and logs it, adding nothing)."
    ),
    "loss_params": "Keyword arguments of the term's `Loss(**loss_params)`.",
    "start_iteration": (
        "First trainer iteration the term is active (inclusive); unset = from the start."
    ),
    "end_iteration": "Last trainer iteration the term is active (inclusive); unset = to the end.",
}
