"""CUDA: bf16 step time against a bare loop, eager and compiled, and the loop's syncs per step.

    python -m bench.cuda [--reps 2]
    python -m bench.cuda --smoke     # the same code path at toy sizes, on whatever device

Without a CUDA device (and without --smoke) it prints a skip and measures nothing. The run is
bench/tasks/cuda_bench.py: a launch-bound MLP (8 layers of 1024, batch 256), data already on
the GPU, every extra off; two warm-up epochs absorb the compilation. The syncs are the
warnings of ``torch.cuda.set_sync_debug_mode("warn")``, counted like bench/reads.py counts
reads (on a CPU, under --smoke, it counts the reads instead).
"""

from bench import common, reads

CONFIG = "bench/tasks/cuda_bench.py"
WARMUP_EPOCHS = 2
SMOKE = (
    "model_params.in_dim=16",
    "model_params.width=32",
    "model_params.depth=2",
    "train_ds_params.in_dim=16",
    "train_ds_params.n=1024",
    "train_ds_params.bs=64",
    "max_epochs=4",
)
VARIANTS = {
    "bare_eager": "bare loop, bf16 autocast",
    "gatle_eager": "gatle-ignite, amp_dtype=bf16",
    "bare_compiled": "bare loop + model.compile()",
    "gatle_compiled": "gatle-ignite, compile=True",
}
SYNCS = {"syncs_default": "gatle-ignite, check_every unset", "syncs_k1": "check_every=1"}
# The issue sets no CUDA target; the CPU one for "every extra off" is the natural yardstick.
TARGET = 1.10


def _config(overrides):
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file

    return apply_overrides(load_config_from_file(common.ROOT / CONFIG), overrides)


def run_bare(compiled, cfg):
    import torch
    import torch.nn.functional as F

    from bench.tasks.device_data import get_ds
    from bench.tasks.wide_mlp import Model

    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(common.SEED)
    loader, _ = get_ds(cfg.train_ds_params)
    model = Model(**cfg.model_params).to(device)
    if compiled:
        model.compile()
    optimizer = common.adamw(model)
    stamps = []
    for _ in range(cfg.max_epochs):
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x=x)["logits"], y)
            loss.backward()
            optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        stamps.append(common.clock())
    return stamps


def child(variant, args):
    import torch

    overrides = list(SMOKE if args.smoke else ())
    if variant in SYNCS:
        every = ["check_every=1"] if variant == "syncs_k1" else []
        return reads.count([*overrides, *every], CONFIG, syncs=torch.cuda.is_available())
    kind, mode = variant.split("_")
    cfg = _config(overrides)
    if kind == "bare":
        stamps = run_bare(mode == "compiled", cfg)
    else:
        stamps = common.run_gatle([*overrides, f"compile={mode == 'compiled'}"], CONFIG)["train"]
    iterations = cfg.train_ds_params.n // cfg.train_ds_params.bs
    return common.per_iteration(stamps, iterations, warmup=WARMUP_EPOCHS)


def _timing(results):
    """One table per mode (eager, compiled), and their checks."""
    texts, checks = [], []
    for mode in ("eager", "compiled"):
        bare, gatle = f"bare_{mode}", f"gatle_{mode}"
        pair = {name: results[name] for name in (bare, gatle)}
        text, ratios = common.ratio_table(pair, bare, VARIANTS, "iter")
        texts.append(text)
        name = f"cuda: gatle-ignite {mode} vs bare (bf16, wall)"
        note = f"host cpu {ratios[gatle][1]:.3f}x"
        checks.append(common.Check(name, ratios[gatle][0], TARGET, note=note))
    return "\n\n".join(texts), checks


def run(reps=None, smoke=False):
    """Measure, print the tables, return the checks (bench.run_all calls this)."""
    import torch

    from gatle_ignite.trainer.handlers import DEFAULT_CHECK_EVERY

    print("== CUDA ==")
    if not torch.cuda.is_available() and not smoke:
        reason = "no CUDA device visible to torch; run on a GPU machine to measure"
        print(f"SKIP: {reason}")
        return f"SKIP: {reason}.", [common.unmeasured("cuda: bf16 step", "SKIP", reason)]
    args = ["--smoke"] if smoke else []
    results = common.interleaved("bench.cuda", list(VARIANTS), reps or 2, args)
    text, checks = _timing(results)
    syncs = {name: common.run_child("bench.cuda", name, args) for name in SYNCS}
    every = DEFAULT_CHECK_EVERY if torch.cuda.is_available() else 1
    counted, sync_checks = reads.rows_and_checks(
        syncs, SYNCS, {"syncs_default": 1 / every, "syncs_k1": 1.0}, "cuda syncs"
    )
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (smoke)"
    text += f"\n\nDevice: {device}. Syncs (host reads on a CPU) per training iteration:\n\n"
    text += counted
    print(text)
    return text, checks + sync_checks


if __name__ == "__main__":
    options = [("--smoke", {"action": "store_true", "help": "toy sizes; runs on a CPU too"})]
    common.main(__doc__, run, child, options)
