"""The ``hybridflow`` command: ``hybridflow plugins``, ``hybridflow demo``, ``hybridflow compare``,
``hybridflow export``, ``hybridflow plan``."""

from __future__ import annotations

import argparse
import sys

TRAIN_HINT = (
    "Training is its own command: train with hybridflow-train (Hydra overrides, e.g. "
    "hybridflow-train algorithm.adv_estimator=rloo trainer.seed=1; see README)."
)
"""The end of ``hybridflow --help``: where the training command is."""


def _plugins(args: argparse.Namespace) -> int:
    from hybridflow.plugins import get_plugin_manager
    from hybridflow.plugins.listing import format_plugin_table

    print(format_plugin_table(get_plugin_manager(), verbose=args.verbose))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from hybridflow.estimators.demo import run_demo

    print(run_demo(seed=args.seed))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from hybridflow.tools.compare import CompareError, compare

    try:
        png, table = compare(
            args.paths, args.out, args.threshold, labels=args.label, x=args.x, title=args.title, ignore=args.ignore
        )
    except (FileNotFoundError, CompareError) as error:
        print(f"hybridflow compare: {error}", file=sys.stderr)
        return 2
    print(table.read_text(), end="")
    print(f"\nwrote {png} and {table}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from hybridflow.tools.export import ExportError, export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, adapter=args.adapter)
    except ExportError as error:
        print(f"hybridflow export: {error}", file=sys.stderr)
        return 2
    if args.adapter:
        print(f"wrote {out} (load it with PeftModel.from_pretrained(base_model, {str(out)!r}))")
    else:
        print(f"wrote {out} (load it with AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained)")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from hybridflow.tools.plan import plan_command
    from hybridflow.trainer.config_checks import ConfigError

    try:
        code, text = plan_command(args.overrides, args.json)
    except ConfigError as error:
        print(f"hybridflow plan: {error}", file=sys.stderr)
        return 2
    print(text)
    return code


def version_line() -> str:
    """``hybridflow --version``: the installed distribution's version and where the package is imported from,
    which tells an editable checkout from a wheel in site-packages."""
    from importlib import metadata
    from pathlib import Path

    import hybridflow

    try:
        version = metadata.version("hybridflow")
    except metadata.PackageNotFoundError:
        version = f"{hybridflow.__version__} (not installed)"
    return f"hybridflow {version} from {Path(hybridflow.__file__).parent}"


class _PrintVersion(argparse.Action):
    """``--version`` printed as one unwrapped line (argparse's own action wraps a long path) and only when
    asked (the metadata lookup stays off every other command's start)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``hybridflow`` command line: one subcommand per tool (the docs' commands are checked against it)."""
    parser = argparse.ArgumentParser(prog="hybridflow", description=__doc__, epilog=TRAIN_HINT)
    parser.add_argument("--version", action=_PrintVersion, help="show the version and where it is installed, then exit")
    sub = parser.add_subparsers(dest="command", required=True)
    plugins = sub.add_parser("plugins", help="list installed plugins and what each registered")
    plugins.add_argument("-v", "--verbose", action="store_true", help="also each name's options and docstring summary")
    plugins.set_defaults(func=_plugins)
    demo = sub.add_parser("demo", help="advantages of every installed estimator on one grouped batch")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    cmp = sub.add_parser(
        "compare",
        help="plot and tabulate runs (sweep or run directories), grouped across seeds",
        description="Draw compare.png (training score and validation accuracy, mean and min-max band over seeds; "
        "*accuracy* metrics on a fixed 0-1 axis) and write compare.md (final validation accuracy, steps "
        "to --threshold, train time, tokens/s: mean over seeds ± the 95% Student-t interval's "
        "half-width, n/a with one seed).",
    )
    cmp.add_argument("paths", nargs="+", help="run directories (with metrics.jsonl) or sweep directories")
    cmp.add_argument("--out", default=".", help="where compare.png and compare.md go (default: here)")
    cmp.add_argument("--threshold", type=float, default=0.8, help="validation accuracy for 'steps to reach'")
    cmp.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="SETTING=NAME",
        help="name a setting in the legend and table, once per setting to rename; SETTING is as in "
        "compare.md's setting column or only its values: --label grpo=GRPO "
        "--label adv_estimator=rloo=RLOO",
    )
    cmp.add_argument(
        "--x",
        choices=("step", "samples"),
        default="step",
        help="x axis: training steps (default) or training samples, the responses trained on so far "
        "(step x data.train_batch_size x rollout.n, from each run's .hydra/config.yaml)",
    )
    cmp.add_argument("--title", help="a title over the figure (default: none)")
    cmp.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="KEY",
        help="an override key left out of the grouping, as the seed is (once per key): "
        "--ignore reward_model.model.path when each seed trained its own reward model",
    )
    cmp.set_defaults(func=_compare)
    export = sub.add_parser(
        "export",
        help="write a checkpoint's policy as a transformers model directory with its tokenizer",
        description="Read the actor's shards of a checkpoint in this process (no Ray, no GPUs, any number of saving "
        "ranks) and write an HF model directory: save_pretrained of the model and its tokenizer.",
    )
    export.add_argument("checkpoint", help="a checkpoint directory, .../checkpoints/global_step_<N>")
    export.add_argument("out_dir", help="where the model directory goes (created if missing)")
    export.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA run's checkpoint: write its peft adapter directory (adapter_config.json, "
        "adapter_model.safetensors) instead of the merged model",
    )
    export.set_defaults(func=_export)
    plan = sub.add_parser(
        "plan",
        help="predict each stage's peak memory per rank for a training command's overrides, before anything runs",
        description="The memory plan hybridflow-train checks before Ray starts (trainer.memory_check): each stage's "
        "predicted peak per rank and its parts, the memory a rank has (trainer.memory_limit_gb, else the GPU's, or "
        "on a CPU the available memory shared by the ranks), and whether the run fits. No weights are read. Exit "
        "status 0 when it fits (or no limit is known), 1 when it does not, 2 for a bad config.",
    )
    plan.add_argument("overrides", nargs="*", help="hybridflow-train's overrides, e.g. trainer=gpu model=local ...")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hybridflow`` console script."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
