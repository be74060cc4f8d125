"""A chaos run of the whole DAG: random jobs SIGKILLed, reruns until complete, final artifacts
compared with an uninterrupted run.

Runs the workflow (the embedded default unless --configfile is given) in a scratch directory while
killing running jobs with SIGKILL: the `stillroom <stage>` process of a job and every process
under it, as the loss of a node or an OOM kill would. The jobs to kill are drawn up front from the
dry run's job list (one job of as many distinct rules as there are kills, the rest at random), each
at a random age within its rule's longest job in the uninterrupted run; a target that finishes
before its age is replaced by another job still to come. After a kill Snakemake is left to fail (it
finishes the jobs already running), then it is rerun with the same command, as a user would, until
it completes; a dry run must then find nothing to do.

The uninterrupted run is made first (in its own scratch directory) or reused with --baseline DIR
(which may still be running beside the chaos run: the comparison waits for it), and every file
under results/<experiment>/ is compared: artifacts byte for byte, JSONL records and table cells
where bytes differ, provenance sidecars key by key. What differs by design is counted, not
reported: the `logs/` and `timing/` folders (appended per attempt, and wall times); clock readings,
durations and rates in records and sidecars (`created_at`, `started_at`, `ended_at`, keys ending
`_s`, `runtime`, `per_second`) and the cost ledger's GPU-hours; the digest and size of a file that
differs only so; evaluation's count of `resumed` samples; the git commit where the workflow's code
is the same in both; the runs' own directories in paths. Every other difference is printed; the
exit status is 1 when there is one, or when a dry run after the chaos run finds work left.

    nice -n 15 python bench/chaos.py [--kills 10] [--seed 0] [--cores 2] [--keep]
        [--baseline DIR] [--workdir DIR] [--configfile my.yaml] [--compare-only]
"""

import argparse
import csv
import hashlib
import io
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil

from stillroom.workflow import REPO, snakemake_command, snakemake_env

POLL_S = 0.2
# Files every attempt appends to or that hold wall times: compared by nobody.
EXCLUDED_DIRS = ("logs", "timing")
# Sidecar keys that hold a file's size or digest (an input's, its sidecar's)
DIGEST_KEYS = ("sha256", "bytes", "provenance_sha256")
# Table columns computed from wall times: the cost ledger's spent GPU-hours, their price and the
# estimate's error against them.
WALL_TIME_COLUMNS = re.compile(r"gpu_hours|GPU-hours|GPU \$|est\. GPU-hours")
# Record and sidecar keys that differ by design: a clock reading, a duration or a rate, how many
# records a resumed job found already done (evaluation's `resumed`), and a process's measured peak
# memory (train's `peak_memory_mib.host_rss` / `.gpu`, per rank).
BY_DESIGN_KEYS = re.compile(
    r"(^|_)(created_at|started_at|ended_at|s|runtime|seconds|per_second)$|^resumed$"
)
MEASURED_MEMORY = "peak_memory_mib."
# What a run's records depend on, for sidecars that record two commits.
WORKFLOW_PATHS = ("stillroom", "rules", "Snakefile", "config", "envs", "profiles", "pyproject.toml")


def snakemake_cmd(workdir: Path, configfile: str | None, cores: int, *extra: str) -> list[str]:
    return snakemake_command(
        workdir, "--cores", str(cores), *extra, configfiles=[configfile] if configfile else []
    )


def planned_jobs(workdir: Path, configfile: str | None, cores: int) -> Counter:
    """Jobs per rule of a run from scratch (the dry run's 'Job stats'), without the target rule."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        snakemake_cmd(workdir, configfile, cores, "-n"),
        capture_output=True,
        text=True,
        env=snakemake_env(),
    )
    if proc.returncode:
        sys.exit(f"dry run failed:\n{proc.stderr[-3000:]}")
    text = proc.stdout + proc.stderr
    if "Job stats:" not in text:
        sys.exit(f"{workdir}: the dry run schedules nothing; give an empty --workdir")
    table = text.split("Job stats:")[1].split("total")[0]
    jobs = Counter(
        {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M) if m[1] != "all"}
    )
    return jobs


def complete(workdir: Path, configfile: str | None, cores: int) -> bool:
    """Whether a dry run finds nothing to do."""
    dry = subprocess.run(
        snakemake_cmd(workdir, configfile, cores, "-n"),
        capture_output=True,
        text=True,
        env=snakemake_env(),
    )
    return "Nothing to be done" in dry.stdout + dry.stderr


def experiment_dir(workdir: Path) -> Path:
    dirs = [p for p in (workdir / "results").iterdir() if p.is_dir()]
    if len(dirs) != 1:
        sys.exit(f"{workdir / 'results'}: expected one experiment folder, found {dirs}")
    return dirs[0]


def rule_wall_times(results: Path, rules) -> dict[str, float]:
    """Longest job of each rule in a run, from its timing files (Snakemake's benchmark:)
    (`timing/<rule>[-<wildcards>].tsv`; process start-up included, which a kill can hit too)."""
    times: dict[str, float] = {}
    by_length = sorted(rules, key=len, reverse=True)
    for tsv in (results / "timing").glob("*.tsv"):
        rule = next((r for r in by_length if tsv.stem == r or tsv.stem.startswith(f"{r}-")), None)
        rows = tsv.read_text().splitlines()
        if rule is None or len(rows) < 2:
            continue
        seconds = float(rows[-1].split("\t")[0])
        times[rule] = max(times.get(rule, 0.0), seconds)
    return times


def sidecar_span(results: Path) -> float:
    """First job start to last job end of a finished run, from its sidecars (for a run reused with
    --baseline, whose wall time was not measured here)."""
    starts, ends = [], []
    for side in results.rglob("*.prov.json"):
        prov = json.loads(side.read_text())
        starts.append(datetime.fromisoformat(prov["started_at"]))
        ends.append(datetime.fromisoformat(prov["ended_at"]))
    return (max(ends) - min(starts)).total_seconds()


@dataclass
class Target:
    rule: str
    index: int  # the index-th distinct job of the rule to start
    fraction: float  # killed once its process is this fraction of the rule's longest job old


@dataclass
class Kill:
    rule: str
    stage: str
    age_s: float
    attempt: int
    job: str


class Chaos:
    """Watches one Snakemake process at a time and kills the targeted jobs of it."""

    def __init__(self, jobs: Counter, baseline: Path, kills: int, rng: random.Random):
        self.jobs, self.baseline, self.rng = jobs, baseline, rng
        self.seen: dict[str, list[str]] = {}  # rule -> job command lines in order of first start
        self.finished: set[str] = set()
        self.kills: list[Kill] = []
        self.escaped = 0
        rules = sorted(jobs)
        rng.shuffle(rules)
        picked = rules[:kills]
        weighted = [r for r in sorted(jobs) for _ in range(jobs[r])]
        picked += [rng.choice(weighted) for _ in range(kills - len(picked))]
        self.targets = [self.draw(rule) for rule in picked]

    def draw(self, rule: str, start: int = 0) -> Target:
        index = self.rng.randrange(start, self.jobs[rule])
        return Target(rule, index, self.rng.uniform(0.1, 0.9))

    def age_s(self, target: Target) -> float:
        """Read when the target's job runs: the uninterrupted run may be running beside this one
        (10 s for a rule it has not finished yet)."""
        wall = rule_wall_times(self.baseline, self.jobs).get(target.rule, 10.0)
        return target.fraction * max(wall, 1.0)

    def running(self, snakemake: psutil.Process) -> dict[str, psutil.Process]:
        """The stillroom process of each running job, by the job's command line."""
        out = {}
        try:
            shells = snakemake.children()
        except psutil.NoSuchProcess:
            return out
        for shell in shells:
            try:
                for proc in shell.children():
                    argv = proc.cmdline()
                    if len(argv) > 2 and Path(argv[1]).name == "stillroom":
                        out[" ".join(shell.cmdline()[2:])] = proc
            except psutil.NoSuchProcess:
                continue
        return out

    def retarget(self, target: Target) -> None:
        """The target's job finished before its age: another job of the rule still to start, else
        one of any rule that has one."""
        self.escaped += 1
        started = len(self.seen.get(target.rule, []))
        if started < self.jobs[target.rule]:
            new = self.draw(target.rule, started)
        else:
            left = [r for r in self.jobs if len(self.seen.get(r, [])) < self.jobs[r]]
            if not left:
                self.targets.remove(target)
                return
            rule = self.rng.choice(sorted(left))
            new = self.draw(rule, len(self.seen.get(rule, [])))
        target.rule, target.index, target.fraction = new.rule, new.index, new.fraction

    def watch(self, proc: subprocess.Popen, attempt: int) -> int:
        """Poll until Snakemake exits; returns the number of kills made in this attempt."""
        snakemake = psutil.Process(proc.pid)
        made, before, killed = 0, {}, set()
        while proc.poll() is None:
            now = self.running(snakemake)
            # gone and not killed: the job finished (or failed, which ends this attempt anyway)
            self.finished |= before.keys() - now.keys() - killed
            for job, p in now.items():
                rule = re.search(r"--rule (\S+)", job)[1]
                order = self.seen.setdefault(rule, [])
                if job not in order:
                    order.append(job)
                self.finished.discard(job)
                for target in list(self.targets):
                    if target.rule != rule or order.index(job) != target.index:
                        continue
                    try:
                        age = time.time() - p.create_time()
                    except psutil.NoSuchProcess:
                        continue
                    stage = self.kill(p) if age >= self.age_s(target) else None
                    if stage:
                        killed.add(job)
                        self.kills.append(Kill(rule, stage, round(age, 1), attempt, job))
                        self.targets.remove(target)
                        made += 1
                        break
            # a targeted job that finished (and is not killed) before its age
            for target in list(self.targets):
                order = self.seen.get(target.rule, [])
                if target.index < len(order) and order[target.index] in self.finished:
                    self.retarget(target)
            before = now
            time.sleep(POLL_S)
        return made

    @staticmethod
    def kill(proc: psutil.Process) -> str | None:
        """SIGKILL a job's process and all under it; returns its stage, None if it is gone."""
        try:
            stage = proc.cmdline()[2]
            tree = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None
        for p in tree:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        return stage


def run_to_completion(
    workdir: Path, configfile: str | None, cores: int, chaos: Chaos | None
) -> tuple[float, int, list[str]]:
    """Run (and rerun after each kill) until Snakemake succeeds; returns wall time, reruns and the
    notes of anything a user would have had to do beyond rerunning."""
    notes: list[str] = []
    extra: list[str] = []
    t0 = time.monotonic()
    attempt = 0
    while True:
        log = workdir / f"chaos-snakemake-{attempt}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                snakemake_cmd(workdir, configfile, cores, *extra, "all"),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=snakemake_env(),
            )
            made = chaos.watch(proc, attempt) if chaos else (proc.wait(), 0)[1]
        if proc.returncode == 0:
            return time.monotonic() - t0, attempt, notes
        text = log.read_text()
        if "IncompleteFilesException" in text and "--rerun-incomplete" not in extra:
            notes.append(f"attempt {attempt}: Snakemake refused incomplete files (see {log})")
            extra.append("--rerun-incomplete")
        elif not made:
            sys.exit(f"attempt {attempt} failed without a kill (see {log}):\n{text[-3000:]}")
        attempt += 1


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def flatten(obj, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def same_workflow_code(commit_a: str, commit_b: str) -> bool:
    """Two commits whose workflow (package, rules, configs, environments) is the same: a run that
    spans a commit elsewhere (a bench script, the README) records both."""
    proc = subprocess.run(
        ["git", "-C", str(REPO), "diff", "--quiet", commit_a, commit_b, "--", *WORKFLOW_PATHS],
        capture_output=True,
    )
    return proc.returncode == 0


def in_repo(text: str) -> str:
    """Paths into the repository made relative: a run whose working directory is the repository
    records its files relative, one elsewhere records them absolute."""
    return text.replace(f"{REPO}/", "")


def sidecar_differences(
    a: Path, b: Path, dir_a: Path, dir_b: Path, explained: set[tuple]
) -> tuple[list[str], list[str]]:
    """Keys that differ between two sidecars: (by design, anything else), the runs' own
    directories replaced by one name first. A digest or size differs by design when it is that of
    a file or sidecar that differs only by design (``explained``: pairs of values): an input's
    size and digest, its sidecar's digest, a sibling output's digest."""
    fa = flatten(json.loads(in_repo(a.read_text().replace(str(dir_a), "<run>"))))
    fb = flatten(json.loads(in_repo(b.read_text().replace(str(dir_b), "<run>"))))
    by_design, other = [], []
    # a JSONL file's per-record digests differ by design where the file does (its records'
    # clock readings)
    records_explained = (fa.get("sha256"), fb.get("sha256")) in explained
    for key in sorted(fa.keys() | fb.keys()):
        va, vb = fa.get(key), fb.get(key)
        if va == vb:
            continue
        leaf = re.sub(r"\[\d+\]", "", key.rsplit(".", 1)[-1])
        digest = leaf in DIGEST_KEYS or key.startswith("output_digests.")
        if (
            BY_DESIGN_KEYS.search(leaf)
            or MEASURED_MEMORY in key
            or (digest and (va, vb) in explained)
            or (leaf == "record_sha256" and records_explained)
            or (key == "git.commit" and same_workflow_code(va, vb))
        ):
            whole = re.sub(r"\[\d+\]", "[]", key)
            by_design.append(whole if digest or leaf == "commit" else leaf)
        else:
            other.append(f"{key}: {va!r} != {vb!r}")
    return by_design, other


def records_differing_by_design(a: Path, b: Path) -> set[str] | None:
    """The keys (dotted, at any depth) by which two JSONL files' records differ, line for line,
    when all are keys that differ by design (timestamps, latencies, a grader's seconds); None when
    anything else differs."""
    la, lb = a.read_bytes().splitlines(), b.read_bytes().splitlines()
    if len(la) != len(lb):
        return None
    keys = set()
    for ra, rb in zip(la, lb, strict=True):
        if ra == rb:
            continue
        try:
            da, db = json.loads(ra), json.loads(rb)
        except ValueError:
            return None
        if not isinstance(da, dict) or not isinstance(db, dict):
            return None
        fa, fb = flatten(da), flatten(db)
        differing = {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)}
        if not all(
            BY_DESIGN_KEYS.search(re.sub(r"\[\d+\]", "", k.rsplit(".", 1)[-1])) for k in differing
        ):
            return None
        keys |= differing
    return keys


def compare(base: Path, chaos: Path) -> tuple[int, Counter, list[str]]:
    """Every file under two experiment folders: (files identical, what differs by design and how
    often, differences). Artifacts first, then the sidecars that hash them."""

    def files(root: Path) -> set[Path]:
        return {
            p.relative_to(root)
            for p in root.rglob("*")
            if p.is_file() and p.relative_to(root).parts[0] not in EXCLUDED_DIRS
        }

    fa, fb = files(base), files(chaos)
    findings = [f"only in the uninterrupted run: {p}" for p in sorted(fa - fb)]
    findings += [f"only in the chaos run: {p}" for p in sorted(fb - fa)]
    same, by_design, explained = 0, Counter(), set()
    common = sorted(fa & fb)
    sidecars = [rel for rel in common if rel.name.endswith(".prov.json")]
    for rel in common:
        a, b = base / rel, chaos / rel
        if rel.name.endswith(".prov.json"):
            continue
        if sha256(a) == sha256(b):
            same += 1
            continue
        if rel.suffix == ".jsonl":
            differing = records_differing_by_design(a, b)
        elif (columns := table_columns_differing(a, b)) and all(
            WALL_TIME_COLUMNS.match(c) for c in columns
        ):
            differing = {f"column {c}" for c in columns}
        else:
            differing = None
        if differing is None:
            findings.append(f"{rel}: {describe(a, b)}")
            continue
        by_design.update(f"{rel.suffix} {k}" for k in differing)
        explained |= {(sha256(a), sha256(b)), (a.stat().st_size, b.stat().st_size)}

    def compared(rel: Path) -> tuple[list[str], list[str]]:
        a, b = base / rel, chaos / rel
        return sidecar_differences(a, b, base.parent.parent, chaos.parent.parent, explained)

    # A consumer's sidecar holds the digest of each input's sidecar: a sidecar that differs only by
    # design explains that digest, until no more are explained (inputs come in any order).
    while True:
        grown = {
            (sha256(base / rel), sha256(chaos / rel)) for rel in sidecars if not compared(rel)[1]
        } - explained
        if not grown:
            break
        explained |= grown
    for rel in sidecars:
        t, other = compared(rel)
        by_design.update(f"sidecar {k}" for k in t)
        findings += [f"{rel}: {d}" for d in other]
        same += not other
    return same, by_design, findings


def table_rows(path: Path) -> list[tuple[tuple[str, ...], tuple[str, ...]]] | None:
    """(header, row) for every line of a CSV or markdown table file; None where a line of a
    markdown file is not a table row (then the file is compared line by line)."""
    text = path.read_text()
    if path.suffix == ".csv":
        rows = list(csv.reader(io.StringIO(text)))
        return [(tuple(rows[0]), tuple(r)) for r in rows]
    out, header = [], ()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            out.append(((), (line,)))
            continue
        cells = tuple(c.strip() for c in line.strip("|").split("|"))
        if i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = cells
        out.append((header, cells))
    return out


def table_columns_differing(a: Path, b: Path) -> set[str] | None:
    """The columns whose cells differ between two tables of the same shape; None when they
    differ otherwise (or are not tables). A table's HTML page is its Markdown rendered with a
    caption (analysis/tables/render.py): judged by the Markdown beside it."""
    if a.suffix == ".html" and a.with_suffix(".md").exists() and b.with_suffix(".md").exists():
        return table_columns_differing(a.with_suffix(".md"), b.with_suffix(".md")) or None
    if a.suffix not in (".csv", ".md"):
        return None
    ra, rb = table_rows(a), table_rows(b)
    if len(ra) != len(rb):
        return None
    columns = set()
    for (ha, ca), (hb, cb) in zip(ra, rb, strict=True):
        if ca == cb:
            continue
        if ha != hb or len(ca) != len(cb) or len(ha) != len(ca):
            return None
        columns |= {ha[j] for j in range(len(ca)) if ca[j] != cb[j]}
    return columns


def describe(a: Path, b: Path) -> str:
    try:
        la, lb = a.read_text().splitlines(), b.read_text().splitlines()
    except UnicodeDecodeError:
        return f"binary, {a.stat().st_size} vs {b.stat().st_size} bytes"
    diff = [i for i in range(max(len(la), len(lb))) if la[i : i + 1] != lb[i : i + 1]]
    first = diff[0]
    return (
        f"{len(diff)} of {max(len(la), len(lb))} lines differ; first, line {first + 1}: "
        f"{la[first] if first < len(la) else '<none>'!r:.200} vs "
        f"{lb[first] if first < len(lb) else '<none>'!r:.200}"
    )


def report_comparison(base_dir: Path, work: Path, configfile: str | None, cores: int) -> bool:
    """Wait for the uninterrupted run if it is still running, compare, print; True when the chaos
    run is complete and identical but for what differs by design."""
    stale = not complete(work, configfile, cores)
    while any((base_dir / ".snakemake" / "locks").glob("*")):
        print(f"waiting for the uninterrupted run in {base_dir} to finish", flush=True)
        time.sleep(30)
    if not complete(base_dir, configfile, cores):
        sys.exit(f"{base_dir}: the uninterrupted run is not complete")
    same, by_design, findings = compare(experiment_dir(base_dir), experiment_dir(work))
    print(f"stale after the run  {'yes' if stale else 'no'}")
    print(f"files identical      {same} (sidecars: but for what differs by design)")
    print("differing by design  (where: how many files)")
    for key, n in sorted(by_design.items()):
        print(f"  {key}: {n}")
    print(f"differences          {len(findings)}")
    for f in findings:
        print(f"  {f}")
    return not (findings or stale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--configfile")
    ap.add_argument("--baseline", help="an uninterrupted run's directory, reused")
    ap.add_argument("--workdir", help="the chaos run's directory (empty or new); default scratch")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directories")
    ap.add_argument(
        "--compare-only",
        action="store_true",
        help="only compare the finished runs given by --baseline and --workdir",
    )
    args = ap.parse_args()
    if args.compare_only:
        if not (args.baseline and args.workdir):
            ap.error("--compare-only needs --baseline and --workdir")
        base_dir, work = Path(args.baseline).resolve(), Path(args.workdir).resolve()
        sys.exit(0 if report_comparison(base_dir, work, args.configfile, args.cores) else 1)

    scratch: list[Path] = []
    try:
        if args.baseline:
            base_dir, base_wall = Path(args.baseline).resolve(), None
        else:
            base_dir = Path(tempfile.mkdtemp(prefix="stillroom-chaos-base-"))
            scratch.append(base_dir)
            print(f"uninterrupted run in {base_dir}", flush=True)
            base_wall, _, _ = run_to_completion(base_dir, args.configfile, args.cores, None)
        if args.workdir:
            work = Path(args.workdir).resolve()
        else:
            work = Path(tempfile.mkdtemp(prefix="stillroom-chaos-"))
            scratch.append(work)
        jobs = planned_jobs(work, args.configfile, args.cores)
        chaos = Chaos(jobs, experiment_dir(base_dir), args.kills, random.Random(args.seed))
        print(f"chaos run in {work}: {sum(jobs.values())} jobs, {args.kills} kills", flush=True)
        wall, reruns, notes = run_to_completion(work, args.configfile, args.cores, chaos)

        print(f"kills survived       {len(chaos.kills)} (targets redrawn: {chaos.escaped})")
        for k in chaos.kills:
            print(f"  attempt {k.attempt:>2}  {k.rule:<18} {k.stage:<10} at {k.age_s:>6.1f} s")
        stages = Counter(k.stage for k in chaos.kills)
        print(f"stages hit           {len(stages)}: {dict(sorted(stages.items()))}")
        print(f"reruns               {reruns}")
        for note in notes:
            print(f"  {note}")
        ok = report_comparison(base_dir, work, args.configfile, args.cores)
        if base_wall is None:
            # a reused run's wall time was not measured here
            base_wall = sidecar_span(experiment_dir(base_dir))
            print(f"uninterrupted run    first job start to last end {base_wall:.1f} s")
        print(f"chaos run wall       {wall:.1f} s (cost x{wall / base_wall:.2f})")
        if not ok:
            sys.exit(1)
    finally:
        if not args.keep:
            for d in scratch:
                shutil.rmtree(d, ignore_errors=True)
        elif scratch:
            print(f"kept: {', '.join(map(str, scratch))}")


if __name__ == "__main__":
    main()
