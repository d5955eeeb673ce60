"""``gatle-ignite export``'s own arguments, and the command (the work is in gatle_ignite.export)."""

import argparse

from gatle_ignite.export import FORMATS, WEIGHTS

__all__ = ["add_export_arguments", "run_export"]


def _dynamic(text: str) -> tuple:
    from gatle_ignite.export.shapes import parse_dynamic

    try:
        return parse_dynamic(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """``--format``, ``--out``, ``--weights``, ``--dynamic`` and ``--force``."""
    parser.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        help="safetensors: the weights and config.json; pt2: a torch.export program; "
        "onnx: an ONNX graph",
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="the directory to write (must not hold files)"
    )
    parser.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="eval",
        help="eval (default): the weights evaluation saw, after the task's eval_context (an "
        "EMA); raw: the trained weights",
    )
    parser.add_argument(
        "--dynamic",
        action="append",
        default=[],
        type=_dynamic,
        metavar="KEY=DIM[,DIM...]",
        help="also make these dimensions of the model_input tensor KEY dynamic (repeatable); "
        "the batch and the dimensions that vary between sampled batches already are",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace a DIR that holds files, once checks pass"
    )


def run_export(cfg, args: argparse.Namespace) -> int:
    from gatle_ignite.export.command import export_model

    export_model(cfg, args.format, args.out, args.ckpt, args.weights, args.force, args.dynamic)
    return 0
