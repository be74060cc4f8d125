"""What keeps an artifact honest between its job and the next: an input with a sidecar still has the
records (a directory: the files and sizes) its job wrote before a stage reads it; a job's outputs
lose the temporaries a killed attempt left beside them; and a full, read-only or forbidden
filesystem is one line naming the path, never a traceback."""

import errno
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from stillroom import cli
from stillroom.io import (
    DataError,
    atomic_dir,
    atomic_path,
    remove_stale_temporaries,
    stale_temporaries,
    write_jsonl,
    write_text,
)
from stillroom.provenance.sidecars import (
    check_input,
    count_records,
    digest,
    sidecar_path,
    write_sidecars,
)

from .stages.test_dataset import PARAMS as DATASET_PARAMS
from .stages.test_generate import _generate, _shard


def _cut(path: Path, records: int) -> None:
    """Drop the last ``records`` lines whole, as a lost tail of a copy leaves a JSONL file."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-records]))


def _shard_cli(pool: Path, outs: list[Path]) -> int:
    return cli.main(
        [
            "shard",
            "--pool",
            str(pool),
            "--out-shards",
            *map(str, outs),
            "--params",
            json.dumps({"shards": len(outs)}),
        ]
    )


# --- records and sizes against the sidecar -------------------------------------------------------


def test_a_jsonl_sidecar_records_how_many_records_were_written(tmp_path):
    pool = Path(_shard(tmp_path, 30))
    out = [tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"]
    assert _shard_cli(pool, out) == 0  # the pool has no sidecar (a user's file): not checked
    for path in out:
        prov = json.loads(sidecar_path(path).read_text())
        assert prov["records"] == count_records(path) == len(path.read_text().splitlines())
        assert prov["bytes"] == path.stat().st_size
    # a last line without its newline is still a record
    loose = tmp_path / "loose.jsonl"
    loose.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert count_records(loose) == digest(loose)["records"] == 2
    assert "records" not in digest(sidecar_path(loose.with_name("s0.jsonl")))  # JSON, not JSONL


def test_a_graded_shard_cut_short_stops_the_dataset_naming_the_file_and_both_counts(
    tmp_path, capsys
):
    """The issue's case: a graded shard lost its last three records, each line whole; the dataset
    was built three rows short with exit 0. Now the dataset job stops before it reads anything."""
    shard = _shard(tmp_path, 40)
    graded = {}
    for effort in ("low", "medium"):
        gen = tmp_path / f"gen-{effort}.jsonl"
        _generate(shard, str(gen), effort, k=2)
        graded[effort] = tmp_path / f"graded-{effort}.jsonl"
        args = ["grade", "--samples", str(gen), "--out-graded", str(graded[effort])]
        assert cli.main([*args, "--params", "{}"]) == 0
    written = count_records(graded["low"])
    _cut(graded["low"], 3)
    out = tmp_path / "train.jsonl"
    argv = [
        "dataset",
        "--graded",
        *[f"{e}={p}" for e, p in graded.items()],
        "--out-dataset",
        str(out),
        "--params",
        json.dumps(DATASET_PARAMS),
    ]
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"stillroom dataset: error: {graded['low']}: {written - 3} records, but its sidecar "
        f"{graded['low']}.prov.json says its job wrote {written}; it was cut short or changed "
        "since; delete it so the workflow builds it again"
    )
    assert not out.exists() and not sidecar_path(out).exists()
    # more records than written stops it too
    with open(graded["low"], "ab") as fh:
        fh.write(graded["medium"].read_bytes().splitlines(keepends=True)[0] * 4)
    assert cli.main(argv) == 2
    assert f"{written + 1} records, but its sidecar" in capsys.readouterr().err


def test_a_file_of_another_size_is_refused_and_an_old_sidecar_without_records_is_read(tmp_path):
    pool = Path(_shard(tmp_path, 30))
    shards = [tmp_path / "a.jsonl"]
    assert _shard_cli(pool, shards) == 0
    side = sidecar_path(shards[0])
    prov = json.loads(side.read_text())
    # the last record rewritten: as many lines, another size
    lines = shards[0].read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    edited = json.dumps({**last, "prompt": last["prompt"] + " (edited)"}) + "\n"
    shards[0].write_text("".join(lines[:-1]) + edited)
    size = shards[0].stat().st_size
    with pytest.raises(
        Exception, match=rf"{size} bytes, but its sidecar .* wrote {prov['bytes']};"
    ):
        check_input(shards[0])
    # a sidecar written before records were counted: the size alone is compared
    shards[0].write_text("".join(lines))
    side.write_text(json.dumps({k: v for k, v in prov.items() if k != "records"}))
    check_input(shards[0])
    _cut(shards[0], 1)
    with pytest.raises(DataError, match=r"bytes, but its sidecar"):
        check_input(shards[0])


def _checkpoint(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt" / "base"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text('{"model_type": "llama"}\n')
    (ckpt / "model.safetensors").write_bytes(b"\0" * 4096)
    (ckpt / "tokenizer.json").write_text("{}\n")
    write_sidecars({"model": ckpt}, {}, stage="base", params={}, started="t")
    (ckpt / ".snakemake_timestamp").touch()  # Snakemake's marker, written after the job
    return ckpt


def _merge_cli(base: Path, out: Path) -> int:
    return cli.main(
        [
            "merge",
            "--base",
            str(base),
            "--tuned",
            str(base),
            "--out-model",
            str(out),
            "--params",
            json.dumps({"ratio": 0.5}),
        ]
    )


def test_a_checkpoint_missing_a_file_or_of_another_size_stops_its_consumer(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path)
    prov = json.loads(sidecar_path(ckpt).read_text())
    assert prov["sizes"] == {"config.json": 24, "model.safetensors": 4096, "tokenizer.json": 3}
    check_input(ckpt)  # as written
    out = tmp_path / "ckpt" / "merged"
    (ckpt / "model.safetensors").write_bytes(b"\0" * 1000)  # a copy cut short
    assert _merge_cli(ckpt, out) == 2
    assert capsys.readouterr().err.strip() == (
        f"stillroom merge: error: {ckpt}: model.safetensors is 1000 bytes, but its sidecar "
        f"{ckpt}.prov.json says its job wrote 4096; it was cut short or changed since; delete it "
        "so the workflow builds it again"
    )
    (ckpt / "model.safetensors").unlink()
    (ckpt / "stray.bin").write_bytes(b"1")
    assert _merge_cli(ckpt, out) == 2
    err = capsys.readouterr().err
    assert (
        f"{ckpt}: 3 files, but its sidecar {ckpt}.prov.json lists 3 (it lacks model.safetensors "
        "and has stray.bin)" in err
    )
    assert not out.exists()


def test_an_input_without_a_sidecar_is_not_checked(tmp_path):
    data = tmp_path / "mine.jsonl"  # a user's raw file
    write_jsonl(data, [{"a": 1}])
    check_input(data)
    check_input(tmp_path / "missing.jsonl")  # the stage reports a missing input itself


# --- temporaries of a killed attempt --------------------------------------------------------------

KILLED_WRITER = """
import sys, time
from stillroom.io import atomic_dir
with atomic_dir(sys.argv[1]) as tmp:
    (tmp / "weights.bin").write_bytes(b"0" * 1024)
    print(tmp, flush=True)
    time.sleep(120)
"""


def _killed_mid_write(out: Path) -> Path:
    """A writer of ``out`` SIGKILLed while its temporary directory exists, as a preempted training
    job is; the temporary it leaves behind."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    tmp = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert tmp.is_dir() and (tmp / "weights.bin").exists()
    return tmp


def test_a_rerun_removes_what_a_killed_attempt_left_beside_its_outputs(tmp_path, capsys):
    pool = Path(_shard(tmp_path, 30))
    out = tmp_path / "shards" / "shard-00000.jsonl"
    killed = _killed_mid_write(out)  # a directory, as a killed checkpoint writer leaves
    assert killed.name.startswith(".shard-00000.jsonl.") and killed.name.endswith(".tmp")
    side_tmp = out.parent / ".shard-00000.jsonl.prov.json.abcd_123.tmp"  # a killed sidecar write
    side_tmp.write_text("{")
    keep = [  # never this output's temporaries: the resume journal, another output's, look-alikes
        out.parent / "shard-00000.jsonl.partial",
        out.parent / ".shard-00001.jsonl.abcd1234.tmp",
        out.parent / ".shard-00000.jsonl.abcd1234.tmp.keep",
        out.parent / ".shard-00000.jsonl.adapter.abcd1234.tmp",
        out.parent / ".shard-00000.jsonl.abc.tmp",
    ]
    for path in keep:
        path.write_text("mine")
    assert stale_temporaries(out) == [killed]
    assert _shard_cli(pool, [out]) == 0
    assert not killed.exists() and not side_tmp.exists()
    assert all(p.read_text() == "mine" for p in keep)
    assert (
        f"removed {killed}, left by an earlier attempt that was killed" in capsys.readouterr().err
    )
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        [out.name, sidecar_path(out).name, *(p.name for p in keep)]
    )


@pytest.mark.slow
def test_a_training_rerun_after_a_kill_leaves_no_temporary_checkpoint(setup, tmp_path):
    """The issue's case: ``ckpt/.sft.<random>.tmp/`` of a killed training job survived the rerun
    that succeeded. The rerun's ``stillroom train`` removes it before it trains."""
    out = tmp_path / "ckpt" / "sft"
    killed = _killed_mid_write(out)
    params = {"max_steps": 2, "batch_size": 2, "max_length": 128, "seed": 0}
    argv = ["--base", str(setup / "base"), "--dataset", str(setup / "train.jsonl")]
    done = subprocess.run(
        [sys.executable, "-m", "stillroom", "train", *argv, "--out-model", str(out)]
        + ["--params", json.dumps(params)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"removed {killed}" in done.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["sft", "sft.prov.json"]


def test_removing_temporaries_touches_only_the_outputs_own(tmp_path):
    out = tmp_path / "ckpt" / "sft"
    killed = _killed_mid_write(out)
    other = _killed_mid_write(tmp_path / "ckpt" / "sft.adapter")
    finished = tmp_path / "ckpt" / "sft.checkpoints"  # resumable training state
    finished.mkdir()
    assert remove_stale_temporaries(out) == [killed]
    assert not killed.exists() and other.is_dir() and finished.is_dir()
    with atomic_dir(out) as tmp:  # the writer itself is untouched: its temporary is renamed
        (tmp / "w").write_text("1")
    assert (out / "w").read_text() == "1" and stale_temporaries(out) == []


# --- OSErrors are one line naming the path -------------------------------------------------------


def test_an_os_error_is_one_line_naming_the_path():
    full = OSError(errno.ENOSPC, "No space left on device", "results/x/dataset/train.jsonl")
    assert cli.os_error(full) == (
        "results/x/dataset/train.jsonl: No space left on device (ENOSPC); free some space there "
        "and run again"
    )
    rename = OSError(errno.EROFS, "Read-only file system", "a.tmp", None, "results/a")
    assert cli.os_error(rename) == "a.tmp -> results/a: Read-only file system (EROFS)"
    assert cli.os_error(PermissionError(errno.EACCES, "Permission denied", "/x")) == (
        "/x: Permission denied (EACCES)"
    )
    assert cli.os_error(OSError(errno.EIO, "Input/output error")) == "Input/output error (EIO)"


def test_a_write_error_without_a_file_names_the_artifact(tmp_path):
    """A write() on a full disk raises ``[Errno 28] No space left on device`` naming no file: the
    atomic writers raise it again naming what they were writing (for a directory, the file in
    it), and leave no temporary."""
    out = tmp_path / "train.jsonl"
    with pytest.raises(OSError) as info, atomic_path(out):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert isinstance(info.value.__cause__, OSError)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(OSError) as info, atomic_dir(ckpt) as tmp:
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp / "model.safetensors"))
    assert info.value.filename == str(ckpt / "model.safetensors")
    # an error about another file, or not a write's, is left as it was
    with pytest.raises(OSError) as info, atomic_path(out):
        raise OSError(errno.ENOSPC, "No space left on device", "/elsewhere")
    assert info.value.filename == "/elsewhere"
    with pytest.raises(ConnectionResetError), atomic_path(out):
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs (root only; skipped where mounting is not permitted)."""
    mnt = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_one_line_naming_the_artifact(tmp_path, full_disk):
    """A real full filesystem: the stage's output does not fit; the CLI says so in one line that
    names the artifact, exit 2, and nothing half-written is left there."""
    pool = tmp_path / "pool.jsonl"
    rows = [
        {"prompt_id": f"p{i}", "source": "s", "kind": "math", "prompt": "x" * 900, "answer": "1"}
        for i in range(2000)
    ]
    write_jsonl(pool, rows)  # about 2 MB, twice the disk
    out = full_disk / "shard-00000.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stillroom",
            "shard",
            "--pool",
            str(pool),
            "--out-shards",
            str(out),
            "--params",
            '{"shards": 1}',
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"stillroom shard: error: {out}: No space left on device (ENOSPC); free some space there "
        "and run again"
    )
    assert "Traceback" not in proc.stderr
    assert list(full_disk.iterdir()) == []
    # a write_text that does not fit is named too
    with pytest.raises(OSError) as info:
        write_text(full_disk / "big.md", "x" * (2 << 20))
    assert info.value.filename == str(full_disk / "big.md")
