"""Server starts per recipe, before and after serve once, use many: the jobs that reach a
self-hosted teacher or a served checkpoint (each started its own server before), against the
servers the plan starts now (Plan.services: one per teacher server and per evaluated checkpoint),
and the estimate's teacher start-up share of generation GPU-hours and dollars per million output
tokens. From the configs alone, offline; prints numbers only.

    .venv/bin/python bench/server_starts.py [--configfile YAML ...]   # default: every recipe
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stillroom.config import ConfigError, Experiment, load_yaml, merge_configs  # noqa: E402
from stillroom.plan.dag import Plan  # noqa: E402
from stillroom.plan.estimate import EstimateError, bill  # noqa: E402


def clients(plan: Plan) -> int:
    """The jobs that reach a server: generation jobs of a served teacher, and every evaluation job
    when evaluation is served."""
    gen = plan.generation
    jobs = sum(
        gen.shards_of(efforts[0])
        for efforts in plan.effort_keys.values()
        if plan.teacher_served(gen.teacher_of(efforts[0]))
    )
    return jobs + (len(plan.evaluations()) if plan.eval_served else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="+", help="recipes (default: config/experiments/)")
    args = parser.parse_args()
    paths = args.configfile or sorted(map(str, (REPO / "config" / "experiments").glob("*.yaml")))
    print(f"{'recipe':<34} {'clients':>8} {'starts':>7} {'start GPU-h %':>14} {'$/M out':>8}")
    for path in paths:
        config = load_yaml(path)
        if "extends" in config:  # an overlay: on top of its recipe
            config = merge_configs(load_yaml(Path(path).parent / config.pop("extends")), config)
        try:
            exp = Experiment.parse(config)
        except ConfigError:
            continue  # not a whole experiment on its own
        plan = Plan(exp, exp.dump(), REPO)
        share = per_mtok = "-"
        try:
            gen = bill(exp, REPO).parts.get("generation", {})
            if gen.get("starts"):
                share = f"{100 * gen['start_gpu_hours'] / gen['gpu_hours']:.1f}"
            if gen.get("output_tokens"):
                per_mtok = f"{gen['usd'] / gen['output_tokens'] * 1e6:.2f}"
        except EstimateError:
            pass  # no cost.estimate figures: starts only
        name = Path(path).stem
        print(f"{name:<34} {clients(plan):>8} {len(plan.services()):>7} {share:>14} {per_mtok:>8}")


if __name__ == "__main__":
    main()
