"""The train stage: SFT lowers the loss and saves a loadable model; bad rows, examples truncated to
nothing and bad params fail before training; a killed job resumes to the same weights."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer

from stillroom.config import ConfigError, Experiment, merge_configs
from stillroom.io import DataError
from stillroom.stages.train import Params, job_params
from stillroom.stages.train import run as train_stage

from ..conftest import default_config, synthetic_rows

RENORM = [{"fn": "renorm_rows", "match": [r"self_attn\.q_proj\.weight$"], "dim": -1, "norm": 1.0}]


@pytest.mark.slow
def test_train_sft_lowers_loss_and_saves_model(setup, tmp_path):
    lines = []
    params = dict(
        lr=5e-3,
        max_steps=60,
        batch_size=4,
        max_length=256,
        logging_steps=5,
        warmup_ratio=0.1,
        seed=0,
    )
    metrics = train_stage(
        base=setup / "base",
        dataset=setup / "train.jsonl",
        out_model=tmp_path / "sft",
        params=params,
        threads=2,
        log=lines.append,
    )
    assert metrics["examples"] == 200 and metrics["steps"] == 60
    assert 0 < metrics["supervised_tokens"] < metrics["total_tokens"]
    assert metrics["final_loss"] < 0.3 * metrics["first_loss"], metrics
    assert metrics["tokens_per_second"] > 0 and 0.5 < metrics["packing_efficiency"] <= 1
    assert 0 < metrics["tokens_seen"] <= 60 * 4 * 256  # steps x batch x max_length
    assert any(line.startswith("step 60/60 loss") for line in lines), lines
    json.dumps(metrics, allow_nan=False)  # goes into the provenance sidecar

    out = tmp_path / "sft"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "sft"
    ]  # no temporary directory left behind
    assert not (out / "trainer").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert (
        model.config.use_cache
        and model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    )
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 5?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        gen = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert tok.decode(gen[0, prompt["input_ids"].shape[1] :]).startswith("<think>")


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" if r is not None else "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"id": "x", "messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"id": "x", "messages": [{"role": "teacher", "content": "hi"}]}, "role"),
        ({"id": "x", "prompt": "hi"}, "missing key 'messages'"),
    ],
)
def test_bad_rows_name_file_and_line(setup, tmp_path, bad, match):
    good = synthetic_rows(2)
    path = write_rows(
        tmp_path / "data.jsonl", [good[0], None, good[1], bad]
    )  # the blank line still counts
    with pytest.raises(DataError, match=rf"data\.jsonl:4: .*{match}"):
        train_stage(base=setup / "base", dataset=path, out_model=tmp_path / "out", params={})
    assert not (tmp_path / "out").exists()


def test_examples_truncated_to_no_supervision_fail(setup, tmp_path):
    rows = synthetic_rows(3)
    rows[1]["messages"][-2]["content"] = "What is " + " + ".join(["1"] * 100) + "?"
    path = write_rows(tmp_path / "data.jsonl", rows)
    with pytest.raises(DataError, match=r"1 of 3 examples .* max_length=64 \(ids: ex-1\)"):
        train_stage(
            base=setup / "base", dataset=path, out_model=tmp_path / "out", params={"max_length": 64}
        )


def test_a_student_with_the_real_qwen3_template_trains_and_keeps_it(setup, tmp_path):
    """Qwen3's own template has no generation markers: training renders with TRL's variant, and
    the checkpoint serves with the model's own."""
    qwen3 = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    base = tmp_path / "base"
    shutil.copytree(setup / "base", base)
    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = qwen3
    tok.save_pretrained(base)
    params = dict(max_steps=2, batch_size=4, max_length=256, seed=0)
    lines = []
    metrics = train_stage(
        base=base,
        dataset=setup / "train.jsonl",
        out_model=tmp_path / "sft",
        params=params,
        log=lines.append,
    )
    assert metrics["chat_template"] == "trl" and metrics["supervised_tokens"] > 0
    check = metrics["template_check"]
    assert check["passed"] and check["rows_checked"] == check["rows"] == 200
    assert check["reasoning_field"] == "reasoning_content"
    assert any("TRL's qwen3_training.jinja" in line for line in lines), lines
    assert AutoTokenizer.from_pretrained(tmp_path / "sft").chat_template == qwen3


def student_with(setup, tmp_path, name):
    """The test student with one of TRL's chat templates as its own."""
    base = tmp_path / name
    shutil.copytree(setup / "base", base)
    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / name).read_text()
    tok.save_pretrained(base)
    return base


def tagged_rows(n):
    """Rows as the dataset stage writes them: the effort tag in a system turn."""
    tag = [{"role": "system", "content": "{effort: low}"}]
    return [
        {
            **row,
            "tagged": True,
            "messages": tag + [m for m in row["messages"] if m["role"] != "system"],
        }
        for row in synthetic_rows(n)
    ]


def stillroom_train(base, dataset, out, params):
    import subprocess
    import sys

    args = ["--base", str(base), "--dataset", str(dataset), "--out-model", str(out)]
    return subprocess.run(
        [sys.executable, "-m", "stillroom", "train", *args, "--params", json.dumps(params)],
        capture_output=True,
        text=True,
    )


def test_stillroom_train_feeds_reasoning_content_and_records_the_check(setup, tmp_path):
    """Qwen3.6's template renders a turn's reasoning only from reasoning_content: the CLI trains
    with it fed there, and the check's outcome is in the checkpoint's provenance."""
    from stillroom.provenance.sidecars import read_sidecar

    rows = tagged_rows(24)
    dataset = write_rows(tmp_path / "tagged.jsonl", rows)
    base = student_with(setup, tmp_path, "qwen3_6.jinja")
    params = {"max_steps": 2, "batch_size": 4, "max_length": 256, "seed": 0}
    done = stillroom_train(base, dataset, tmp_path / "sft", params)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reasoning fed as reasoning_content" in done.stderr
    check = read_sidecar(tmp_path / "sft")["metrics"]["template_check"]
    assert check["passed"] and check["rows_checked"] == 24
    assert check["reasoning_field"] == "reasoning_content"
    assert "qwen3_6_training.jinja" in check["template"] and len(check["sha256"]) == 64


def test_stillroom_train_refuses_a_template_before_any_step(setup, tmp_path):
    """Gemma's template takes no system turn: the run stops before training, naming the
    template and the setting that places the effort tag elsewhere."""
    rows = tagged_rows(8)
    dataset = write_rows(tmp_path / "tagged.jsonl", rows)
    base = student_with(setup, tmp_path, "gemma.jinja")
    refused = stillroom_train(base, dataset, tmp_path / "sft", {"max_length": 256})
    assert refused.returncode != 0
    assert "TRL's gemma_training.jinja" in refused.stderr
    assert "System role not supported" in refused.stderr
    assert "student.effort_tag_in: user" in refused.stderr
    assert "step " not in refused.stderr and not (tmp_path / "sft").exists()


def test_unknown_param_raises(setup):
    with pytest.raises(ConfigError, match="train: unknown key 'lerning_rate'"):
        Params.parse({"lerning_rate": 1e-3}, where="train")
    with pytest.raises(
        ConfigError, match="train.max_length: Input should be greater than or equal to 16"
    ):
        Params.parse({"max_length": 0}, where="train")


def test_the_chat_template_reaches_the_job_once_as_its_input_file():
    # with train.chat_template set, the job gets the file (--chat-template) and no param names it
    config = merge_configs(default_config(), {"train": {"chat_template": "x.jinja"}})
    exp = Experiment.parse(config)
    params = json.loads(job_params(exp).as_param())
    assert "chat_template" not in params and "phases" not in params
    assert params["seed"] == exp.seed and params["lr"] == exp.train.lr
    with pytest.raises(ConfigError, match="train.chat_template: Input should be None"):
        Params.parse({"chat_template": "x.jinja"}, where="train")


def test_full_fine_tunes_keep_float32_master_weights():
    with pytest.raises(ConfigError, match="train.dtype: .* without a float32 master copy"):
        Params.parse({"method": "full", "dtype": "bfloat16"}, where="train")
    assert Params.parse({"method": "full", "dtype": "auto"}, where="train").dtype == "auto"


def test_hooks_and_adapters_do_not_mix():
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj"]}
    with pytest.raises(ConfigError, match="train.weight_hooks: .* base is frozen"):
        Params.parse({"method": "lora", "lora": lora, "weight_hooks": RENORM}, where="train")
    with pytest.raises(
        ConfigError, match="train.sampled_options.loops: Input should be a valid list"
    ):
        Params.parse({"sampled_options": {"loops": 3}}, where="train")


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_weights(setup, tmp_path):
    """SIGKILL the real CLI after a checkpoint is written; the rerun resumes from it and ends where
    an uninterrupted run ends (same data order, optimizer and scheduler state, RNG)."""
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    params = {
        "lr": 3e-3,
        "max_steps": 24,
        "batch_size": 2,
        "max_length": 128,
        "logging_steps": 4,
        "seed": 0,
        "save_steps": 6,
    }

    def cmd(out):
        return [
            sys.executable,
            "-m",
            "stillroom",
            "train",
            "--base",
            str(setup / "base"),
            "--dataset",
            str(setup / "train.jsonl"),
            "--out-model",
            str(out),
            "--params",
            json.dumps(params),
        ]

    subprocess.run(cmd(tmp_path / "straight"), check=True, capture_output=True)
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while (
        not (tmp_path / "killed.checkpoints" / "checkpoint-12").exists()
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists() and (tmp_path / "killed.checkpoints" / "checkpoint-12").exists()
    resumed = subprocess.run(cmd(out), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "checkpoint-" in resumed.stderr
    a, b = (
        load_file(tmp_path / "straight" / "model.safetensors"),
        load_file(out / "model.safetensors"),
    )
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert not (tmp_path / "killed.checkpoints").exists()  # cleaned once the model is in place


@pytest.mark.slow
def test_killed_training_resumes_from_a_time_based_checkpoint(setup, tmp_path):
    """With save_steps 0 (the default), save_minutes alone checkpoints: a job SIGKILLed after such
    a checkpoint resumes from it to the bytes of an uninterrupted run, and those bytes are the
    ones a run that never checkpoints writes."""
    from safetensors.torch import load_file

    from tests.runtime.test_launch import kill_and_resume

    params = {
        "lr": 3e-3,
        "max_steps": 24,
        "batch_size": 2,
        "max_length": 128,
        "logging_steps": 4,
        "seed": 0,
        "save_minutes": 0.002,  # 120 ms: every few steps
    }
    straight, out = kill_and_resume(setup / "base", setup / "train.jsonl", params, tmp_path)
    never = train_stage(
        base=setup / "base",
        dataset=setup / "train.jsonl",
        out_model=tmp_path / "never",
        params={**params, "save_minutes": 0},
        threads=2,
        log=lambda _: None,
    )
    assert never["steps"] == 24 and not (tmp_path / "never.checkpoints").exists()
    a, b = load_file(straight / "model.safetensors"), load_file(out / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert (straight / "model.safetensors").read_bytes() == (
        tmp_path / "never" / "model.safetensors"
    ).read_bytes()


def test_save_clock_counts_training_time_since_the_last_checkpoint():
    """Due once the interval has passed since the start or the last save, never at the last step
    (the model is saved right after it), never with 0 minutes; in one process nothing is sent."""
    from transformers import TrainerState

    from stillroom.runtime.checkpoints import SaveClock

    now = 100.0
    clock = SaveClock(0.5, clock=lambda: now)
    mid, last = TrainerState(global_step=5, max_steps=9), TrainerState(global_step=9, max_steps=9)
    now = 129.0
    assert not clock.due(mid, "cpu")
    now = 130.0
    assert clock.due(mid, "cpu") and not clock.due(last, "cpu")
    clock.restart()
    now = 150.0
    assert not clock.due(mid, "cpu")
    now = 1e9
    assert not SaveClock(0, clock=lambda: now).due(mid, "cpu")


def test_a_changed_save_minutes_still_resumes_and_any_other_change_does_not(setup):
    """When checkpoints were written does not change the weights: a job resubmitted with another
    save_minutes resumes; another lr (or save_steps, which a resumed Trainer keeps) starts over."""
    from stillroom.runtime.sft import checkpoint_fingerprint

    def fingerprint(**params):
        made_with = Params.parse(params, where="train").dump()
        return checkpoint_fingerprint(made_with, setup / "base", setup / "train.jsonl", "{{ x }}")

    assert fingerprint(save_minutes=30) == fingerprint(save_minutes=5) == fingerprint()
    assert fingerprint(lr=1e-4) != fingerprint()
    assert fingerprint(save_steps=10) != fingerprint()


def test_a_phase_selects_its_efforts_and_can_drop_the_tags():
    from stillroom.config.training import TrainPhase
    from stillroom.runtime.sft import select_rows

    def row(i, effort, tagged):
        tag = [{"role": "system", "content": f"{{reasoning effort: {effort}}}"}] if tagged else []
        turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        return {"id": str(i), "effort": effort, "tagged": tagged, "messages": tag + turns}

    rows = [row(0, "medium", True), row(1, "medium", False), row(2, "high", True)]
    medium = TrainPhase(name="medium", efforts=["medium"], tags="none", epochs=2)
    picked = select_rows(rows, medium, "d.jsonl")
    assert [r["id"] for r in picked] == ["0", "1"]
    assert all(r["messages"][0]["role"] == "user" and not r["tagged"] for r in picked)
    assert rows[0]["messages"][0]["role"] == "system"  # the caller's rows are left as they were
    mixed = TrainPhase(name="mixed", epochs=1)
    assert select_rows(rows, mixed, "d.jsonl") == rows
    with pytest.raises(DataError, match="no rows for train phase 'xhigh'"):
        select_rows(rows, TrainPhase(name="xhigh", efforts=["xhigh"], epochs=1), "d.jsonl")
    untagged = [{"id": "9", "messages": rows[0]["messages"]}]
    with pytest.raises(DataError, match="d.jsonl: row 9 has no 'effort'"):
        select_rows(untagged, medium, "d.jsonl")


def test_effort_tag_in_user_moves_a_rows_tag_to_the_head_of_its_user_turn():
    from stillroom.runtime.sft import place_tags

    rows = tagged_rows(2) + [{"id": "plain", "messages": synthetic_rows(1)[0]["messages"]}]
    assert place_tags(rows, "system") == rows
    moved = place_tags(rows, "user")
    assert [m["role"] for m in moved[0]["messages"]] == ["user", "assistant"]
    assert moved[0]["messages"][0]["content"].startswith("{effort: low}\nWhat is ")
    assert moved[2] == rows[2]  # a system turn of an untagged row is not a tag
