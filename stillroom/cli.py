"""Stillroom's commands: the user commands (check a config, estimate, plan a SLURM run, show, audit,
bundle) and one stage command per stage, ``stillroom <stage> --<input> PATH ... --<output> PATH
--params JSON``, which the rules run.

Each stage is a function of ``stillroom.stages``, whose module is named after the ``rules/*.smk``
file of its rule and declares the stage's contract beside it (stages/contract.py); this module
parses paths and params, times the call, and writes the provenance sidecar of every output. Rules
call these commands and nothing else. ``stillroom --help`` lists the two kinds apart.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .io import DataError
from .provenance.sidecars import CONFIG_ENV, WORKFLOW_ENV
from .stages import (
    cost,
    dataset,
    decontam,
    evaluate,
    generate,
    grade,
    grpo,
    merge,
    pool,
    student,
    tables,
    train,
)
from .stages.contract import SERVICE_INPUTS, Contract, contracts, flag

# Every stage, by CLI name, as its module declares it (stages/contract.py).
STAGES: dict[str, Contract] = contracts(
    pool, decontam, generate, grade, dataset, student, train, grpo, merge, evaluate, cost, tables
)
# Stage-shaped commands no rule runs: a user builds a stand-in model with one, so `stillroom --help`
# lists them with the user commands.
USER_STAGES = {"tiny"}
# Commands a rule runs that are no stage: `serve` runs a server until Snakemake stops it, writing
# its service file, not an artifact with provenance (rules/serve.smk, stillroom/stages/serve.py).
RULE_COMMANDS = ("serve",)


def _named(values: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, path = v.partition("=")
        name, path = (name, path) if sep else (Path(v).name.split(".")[0], v)
        if name in out:
            raise DataError(f"two inputs named '{name}': {out[name]} and {path}")
        out[name] = path
    return out


def _load_params(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"--params: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(params, dict):
        raise DataError("--params: expected a JSON object")
    return params


def _logger(stage: str) -> Callable[[str], None]:
    """Progress lines on stderr, which a workflow job appends to its rule's log."""
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{stage} {time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    return log


def _paths(value: Any) -> list[str]:
    """The paths of one input or output argument: a path, a list of them, or NAME=PATH by name."""
    if value is None:
        return []
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, list) else [value]


def run_stage(name: str, args: argparse.Namespace) -> None:
    from .config.base import readable
    from .io import remove_stale_temporaries
    from .provenance.sidecars import (
        Job,
        Notes,
        check_input,
        now,
        redact,
        sidecar_path,
        write_sidecars,
    )

    stage = STAGES[name]
    inputs: dict[str, Any] = {}
    for spec in stage.inputs:
        key = spec.rstrip("*?")
        value = getattr(args, key)
        # an optional input given empty is absent: a rule whose jobs have it or not (a served
        # teacher's `server`) passes `--NAME ''` for the jobs without it
        if spec.endswith("?") and value == "":
            value = None
        inputs[key] = _named(value) if spec.endswith("*") else value
    outputs = {spec.rstrip("*"): getattr(args, "out_" + spec.rstrip("*")) for spec in stage.outputs}
    params = _load_params(args.params)
    # checked once, before any file is touched; the stage takes them typed
    typed = stage.params.parse(params, where=name)
    job = Job(rule=args.rule, config_path=args.config, workflow=args.workflow)
    log = _logger(name)
    # Before any work: every input that has a sidecar still has the records (or files) and size
    # its job wrote (a shard cut short at a line boundary parses cleanly, and would be used short).
    for value in inputs.values():
        for path in _paths(value):
            check_input(path)
    # the job's log opens with what it runs with, readable rather than the rule's JSON string
    log("params:\n" + textwrap.indent(readable(redact(typed.param_values())), "  ").rstrip())
    # The job owns its outputs: what an earlier, killed attempt left beside them goes.
    for value in outputs.values():
        for path in _paths(value):
            for artifact in (path, sidecar_path(path)):
                for stale in remove_stale_temporaries(artifact):
                    log(f"removed {stale}, left by an earlier attempt that was killed")
    notes = Notes()  # what this job reads besides its inputs, for its sidecars
    extras = {"threads": args.threads, "log": log, "notes": notes}
    started = now()
    t0 = time.monotonic()
    out_args = {f"out_{k}": v for k, v in outputs.items()}
    extra_args = {key: extras[key] for key in stage.extras}
    metrics = stage.function(**inputs, **out_args, params=typed, **extra_args) or {}
    metrics["wall_s"] = round(time.monotonic() - t0, 3)
    flat_outputs: dict[str, str] = {}
    for key, value in outputs.items():
        if isinstance(value, list):
            flat_outputs.update({f"{key}[{i}]": v for i, v in enumerate(value)})
        else:
            flat_outputs[key] = value
    # a shared server's service file is no artifact (Snakemake deletes it with the server): the
    # weights the server loaded are in the job's notes, the server it used in its metrics
    flat_inputs = {k: v for k, v in inputs.items() if v is not None and k not in SERVICE_INPUTS}
    write_sidecars(
        flat_outputs,
        flat_inputs,
        stage=name,
        params=params,
        started=started,
        metrics=metrics,
        job=job,
        **notes.sidecar_fields(),
    )
    log(f"done in {metrics['wall_s']:.1f}s")


def _merged(configfiles: list[str] | None, root: str) -> dict[str, Any]:
    """``configfiles`` merged in order, as Snakemake merges them; none: the embedded default."""
    from .config import load_yaml, merge_configs

    merged: dict[str, Any] = {}
    for path in configfiles or [str(Path(root) / "config" / "config.yaml")]:
        merged = merge_configs(merged, load_yaml(path))
    return merged


def check_config(paths: list[str] | None, root: str) -> None:
    """Print the resolved config of ``paths`` (merged in order, as Snakemake merges them; none:
    the embedded default)."""
    from .plan.checks import resolve

    print(json.dumps(resolve(_merged(paths, root), root), indent=2))


def estimate(configfiles: list[str] | None, root: str, out_json: str | None) -> None:
    """Print the bill before the run of ``configfiles`` (merged in order, as Snakemake merges
    them; none: the embedded default), offline; optionally write it as JSON."""
    from .io import write_json
    from .plan import estimate as est
    from .plan.checks import resolve

    bill = est.bill(resolve(_merged(configfiles, root), root), root)
    print(est.markdown(bill), end="")
    if out_json:
        write_json(out_json, bill.to_json())


def _audit(args: argparse.Namespace) -> int:
    """The provenance walk; with --recompute, the table also rebuilt and compared; with --cell,
    the drill-down into one model's rows."""
    if args.bundle is not None:
        if args.path is not None or args.recompute or args.cell is not None or args.root:
            raise DataError(
                "--bundle checks an archive on its own: give no artifact, --root, --recompute "
                "or --cell with it"
            )
        from .review.bundle import run_audit

        return run_audit(args.bundle, as_json=args.json)
    if args.path is None:
        raise DataError("give an artifact to audit, or --bundle ARCHIVE")
    if args.regrade and args.cell is None:
        raise DataError("--regrade regrades the records of one model's rows: give --cell MODEL")
    if args.cell is None and not args.recompute:
        from .provenance.audit import run

        return run(args.path, root=args.root, as_json=args.json)
    from .review.recompute import run

    return run(
        args.path,
        root=args.root,
        as_json=args.json,
        recompute_table=args.recompute,
        model=args.cell,
        regrade=args.regrade,
    )


def _configfiles(p: argparse.ArgumentParser, positional: bool = False) -> None:
    """The config argument, as Snakemake takes it: ``--configfile YAML [YAML ...]`` or each file
    after its own flag, merged in order; ``positional``: also bare files before it (the older form
    of `config` and `stand-ins`)."""
    if positional:
        p.add_argument("paths", nargs="*", metavar="YAML", help="config files (older form)")
    p.add_argument(
        "--configfile",
        action="extend",
        nargs="+",
        default=[],
        metavar="YAML",
        help="an experiment config; several (after one --configfile, as Snakemake takes them, or "
        "each after its own) are merged in order"
        + ("" if positional else " (default: config/config.yaml)"),
    )


def _command_list(sub: argparse._SubParsersAction) -> str:
    """`stillroom --help`'s list of commands: the user commands, then the stage commands the rules
    run, each with its one-line summary."""
    summaries = {a.dest: a.help or "" for a in sub._choices_actions}
    stages = [n for n in STAGES if n not in USER_STAGES] + list(RULE_COMMANDS)
    users = [n for n in summaries if n not in stages]
    width = max(shutil.get_terminal_size().columns - 2, 60)
    lines = []
    for title, names in (
        ("user commands", users),
        ("stage commands (run by the workflow's rules; see rules/*.smk)", stages),
    ):
        lines.append(f"{title}:")
        for name in names:
            lines += textwrap.wrap(
                summaries[name],
                width,
                initial_indent=f"  {name:<15} ",
                subsequent_indent=" " * 18,
                break_on_hyphens=False,
            )
        lines.append("")
    return "\n".join(lines) + "`stillroom COMMAND --help` describes a command's arguments."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stillroom",
        usage="%(prog)s [-h] COMMAND ...",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # the commands are listed by kind in the epilog, not as one flat list
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS, prog="stillroom"
    )

    def command(name: str, summary: str, description: str = "") -> argparse.ArgumentParser:
        """A user command: ``summary`` in `stillroom --help`, ``description`` (else the summary)
        in its own --help."""
        return sub.add_parser(name, help=summary, description=description or summary)

    config = command(
        "config",
        "check config files and print the resolved config",
        "check experiment config files (merged in order, as Snakemake merges them; none: "
        "config/config.yaml) and print the resolved config, every default filled in",
    )
    _configfiles(config, positional=True)
    config.add_argument("--root", default=".", help="where relative paths start (the repository)")
    command("schema", "print the JSON schema of an experiment config")
    bill = command(
        "estimate",
        "the bill before the run: tokens, GPU-hours, time, dollars",
        "predict tokens, GPU-hours, wall time and dollars per stage from the config alone "
        "(offline; the figures are cost.estimate's)",
    )
    _configfiles(bill)
    bill.add_argument("--root", default=".", help="where relative paths start (the repository)")
    bill.add_argument("--out-json", metavar="PATH", help="also write the estimate as JSON")
    from .plan import slurm as slurm_plan  # its docstring's first paragraph describes `plan`

    slurm = command(
        "plan",
        "the sbatch jobs profiles/slurm would submit, offline",
        slurm_plan.__doc__.split("\n\n")[0].replace("\n", " "),
    )
    _configfiles(slurm)
    stand_ins = command(
        "stand-ins",
        "build the tiny models a recipe's smoke twin names",
        "build the tiny student and teacher a recipe's smoke twin names in place of hub models "
        "(its student.pretrained and its served teacher's model_path)",
    )
    _configfiles(stand_ins, positional=True)
    stand_ins.add_argument("--root", default=".", help="where relative paths start")
    show = command("show", "print an experiment's tables and where its artifacts are")
    show.add_argument("experiment_dir")
    audit = command(
        "audit",
        "trace an artifact to its raw records; exit 1 on a problem",
        "walk an artifact's provenance to the raw teacher records, re-hashing every file; exit 1 "
        "if anything is modified, missing or stale",
    )
    audit.add_argument(
        "path", nargs="?", help="a table, plot, checkpoint or any other artifact with a .prov.json"
    )
    audit.add_argument(
        "--bundle",
        metavar="ARCHIVE",
        help="check a bundle written by `stillroom bundle` without the raw data: every file "
        "against its manifest, sidecars and consumers, every table recomputed from its records",
    )
    audit.add_argument(
        "--root", help="the directory the pipeline ran in (default: inferred from the sidecar)"
    )
    audit.add_argument(
        "--json", action="store_true", help="print the report as JSON instead of a tree"
    )
    audit.add_argument(
        "--recompute",
        action="store_true",
        help="a table: also build it again from the graded records with its recorded inputs, seed "
        "and params, and name every cell (row and column) that differs",
    )
    audit.add_argument(
        "--cell",
        metavar="MODEL",
        help="a table: the graded records behind MODEL's rows, then its checkpoint, training rows "
        "and the teacher records they came from",
    )
    audit.add_argument(
        "--regrade",
        action="store_true",
        help="with --cell: grade those records again with their recorded grader; exit 1 if a "
        "verdict changed",
    )
    regenerate = command(
        "regenerate",
        "rebuild a results tree's tables from its records, with no upstream job",
        "verify every input of every table of results/<experiment> (copied, or unpacked from a "
        "bundle) against its sidecars, then run Snakemake with only the table rules allowed and "
        "forced; exit 1 naming any input that does not match",
    )
    regenerate.add_argument("experiment_dir", help="results/<experiment> of a run that made tables")
    regenerate.add_argument(
        "--root", help="the directory the pipeline ran in (default: inferred from the sidecars)"
    )
    regenerate.add_argument("--cores", type=int, default=2, help="Snakemake's --cores")
    regenerate.add_argument(
        "--dry-run", action="store_true", help="verify, and show the jobs without running them"
    )
    bundle = command(
        "bundle",
        "write one zip a reviewer can check without the raw data",
        "write one zip a reviewer can check without the raw data: tables, plots, config "
        "snapshots, sidecars, environment locks, the tables' graded records, the snakemake "
        "report and an audit transcript, with a manifest of hashes; exit 1 if the audit of the "
        "run found a problem",
    )
    bundle.add_argument("experiment_dir", help="results/<experiment> of a run that made its tables")
    bundle.add_argument(
        "--out", metavar="ZIP", help="the archive to write (default: <experiment>-bundle.zip here)"
    )
    bundle.add_argument(
        "--root", help="the directory the pipeline ran in (default: inferred from the sidecars)"
    )
    bundle.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help="leave out the snakemake --report HTML (the manifest says so)",
    )
    serve = command(
        "serve",
        "run a server for the jobs of its allocation until Snakemake stops it",
        "start an OpenAI-compatible server (a teacher's, or eval.backend's for one checkpoint) "
        "from its command template, keep its service file current (starting, ready, failed) for "
        "the jobs that are its clients, and stop it on SIGTERM (runtime/service.py)",
    )
    serve.add_argument("--name", required=True, help="what the server serves, for its log")
    serve.add_argument(
        "--spec", required=True, help="the server section (JSON), its command template's values"
    )
    serve.add_argument("--model", help="the checkpoint served: the template's {model_path}")
    serve.add_argument("--out-service", required=True, metavar="PATH", help="the service file")
    serve.add_argument("--server-log", metavar="PATH", help="where the server's output goes")
    for name, stage in STAGES.items():
        p = sub.add_parser(name, help=stage.help, description=stage.help)
        for spec in stage.inputs:
            multi = spec.endswith("*")
            # "*": an experiment may have none (e.g. no benchmarks besides its held-out split)
            p.add_argument(
                f"--{flag(spec)}",
                dest=spec.rstrip("*?"),
                required=not spec.endswith("?"),
                nargs="*" if multi else None,
                metavar="NAME=PATH" if multi else "PATH",
            )
        for spec in stage.outputs:
            multi = spec.endswith("*")
            p.add_argument(
                f"--out-{flag(spec)}",
                dest="out_" + spec.rstrip("*"),
                required=True,
                nargs="+" if multi else None,
                metavar="PATH",
            )
        p.add_argument("--params", help="JSON object, or @file.json")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--rule", help="the Snakemake rule, recorded in provenance")
        p.add_argument(
            "--config",
            default=os.environ.get(CONFIG_ENV),
            help=f"the resolved config's snapshot, recorded by its hash (default: ${CONFIG_ENV})",
        )
        p.add_argument(
            "--workflow",
            default=os.environ.get(WORKFLOW_ENV),
            help=f"the workflow's directory, its git state recorded (default: ${WORKFLOW_ENV})",
        )
    parser.epilog = _command_list(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .teachers import TeacherError
    from .teachers.budget import BudgetExhausted

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no fork warnings from tokenizers
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars would fill the rules' logs
    args = build_parser().parse_args(argv)
    try:
        if args.command == "show":
            from .stages.tables import show

            show(args.experiment_dir)
        elif args.command == "audit":
            return _audit(args)
        elif args.command == "regenerate":
            from .review.regenerate import run as regenerate

            return regenerate(args.experiment_dir, args.root, args.cores, args.dry_run)
        elif args.command == "bundle":
            from .review.bundle import run_bundle

            return run_bundle(args.experiment_dir, args.out, args.root, args.report)
        elif args.command == "config":
            check_config(args.paths + args.configfile, args.root)
        elif args.command == "estimate":
            estimate(args.configfile, args.root, args.out_json)
        elif args.command == "plan":
            from .plan.slurm import print_plan

            print_plan(args.configfile)
        elif args.command == "serve":
            from .stages.serve import run as serve

            log = _logger("serve")
            return serve(args.name, args.spec, args.out_service, args.model, args.server_log, log)
        elif args.command == "schema":
            from .config import schema

            print(json.dumps(schema(), indent=2))
        elif args.command == "stand-ins":
            from .runtime.stand_ins import build_for_config

            paths = args.paths + args.configfile
            if not paths:
                raise DataError("give the recipe's config: --configfile YAML [OVERLAY ...]")
            build_for_config(paths, args.root)
        else:
            run_stage(args.command, args)
    except (DataError, ValueError, TeacherError, BudgetExhausted) as exc:
        print(f"stillroom {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a read-only or forbidden path, a missing file
        print(f"stillroom {args.command}: error: {os_error(exc)}", file=sys.stderr)
        return 2
    return 0


def os_error(exc: OSError) -> str:
    """One line naming the path(s), the system's reason and its errno name, e.g.
    ``results/x/dataset/train.jsonl: No space left on device (ENOSPC)``."""
    reason = exc.strerror or str(exc)
    if exc.errno in errno.errorcode:
        reason += f" ({errno.errorcode[exc.errno]})"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += "; free some space there and run again"
    names = [
        os.fsdecode(f) if isinstance(f, str | bytes | os.PathLike) else str(f)
        for f in (exc.filename, exc.filename2)
        if f is not None
    ]
    return f"{' -> '.join(names)}: {reason}" if names else reason


if __name__ == "__main__":
    sys.exit(main())
