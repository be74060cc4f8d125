import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stillroom.conversations import load_conversations
from stillroom.io import DataError
from stillroom.train import build_trainer, check_params, collate_packed_rows, train_sft

from ..conftest import synthetic_rows


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(input_ids=ids[None], **kwargs).logits[0]


def test_packed_documents_do_not_attend_to_each_other(setup):
    model = AutoModelForCausalLM.from_pretrained(setup / "base", attn_implementation="sdpa").eval()
    tok = AutoTokenizer.from_pretrained(setup / "base")
    docs = [
        tok.apply_chat_template(r["messages"], return_dict=True)["input_ids"]
        for r in synthetic_rows(4, seed=1)
    ]
    docs.append(torch.randint(0, len(tok), (23,)).tolist())
    alone = [logits(model, torch.tensor(d), use_cache=False) for d in docs]
    lengths = [len(d) for d in docs]
    packed = torch.tensor(sum(docs, []))
    restart = torch.cat([torch.arange(n) for n in lengths])[None]

    def max_diff(**kwargs):
        parts = logits(model, packed, **kwargs).split(lengths)
        return max((a - b).abs().max().item() for a, b in zip(alone, parts))

    assert max_diff(position_ids=restart, use_cache=False) < 1e-4
    # Guards that the check can fail: with a cache, or without restarting positions, documents mix.
    assert max_diff(position_ids=restart, use_cache=True) > 1e-2
    assert max_diff(use_cache=False) > 1e-2

    # The training layout: several packed rows, right-padded, each row masked per document.
    rows = [docs[:2], docs[2:]]
    batch = collate_packed_rows(
        [
            {"input_ids": sum(r, []), "labels": sum(r, []), "seq_lengths": [len(d) for d in r]}
            for r in rows
        ],
        pad_token_id=tok.pad_token_id,
    )
    with torch.no_grad():
        out = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    i = 0
    for row, r in enumerate(rows):
        start = 0
        for d in r:
            assert (out[row, start : start + len(d)] - alone[i]).abs().max() < 1e-4
            start, i = start + len(d), i + 1
        assert (batch["labels"][row, start:] == -100).all()

    # FlashAttention's layout: the same rows flattened into one, which is the only shape in which it reads
    # documents from position_ids; the same per-document logits here through sdpa.
    flat = collate_packed_rows(
        [
            {"input_ids": sum(r, []), "labels": sum(r, []), "seq_lengths": [len(d) for d in r]}
            for r in rows
        ],
        pad_token_id=tok.pad_token_id,
        flatten=True,
    )
    assert flat["input_ids"].shape == (1, sum(lengths))
    assert flat["position_ids"][0].tolist() == restart[0].tolist()
    assert (flat["labels"][0][restart[0] == 0] == -100).all()
    with torch.no_grad():
        out = model(**{k: v for k, v in flat.items() if k != "labels"}, use_cache=False).logits[0]
    assert max((a - b).abs().max().item() for a, b in zip(alone, out.split(lengths))) < 1e-4


def test_trainer_batches_label_only_assistant_tokens(setup, tmp_path):
    examples = load_conversations(setup / "train.jsonl")[:40]
    params = check_params(dict(batch_size=4, max_length=128))
    trainer = build_trainer(setup / "base", examples, params, tmp_path / "trainer")
    tok = trainer.processing_class
    expected = {}
    for ex in examples:
        enc = tok.apply_chat_template(
            ex["messages"], return_dict=True, return_assistant_tokens_mask=True
        )
        expected[tuple(enc["input_ids"])] = enc["assistant_masks"]

    batch = next(iter(trainer.get_train_dataloader()))
    assert sorted(batch) == [
        "input_ids",
        "labels",
        "position_ids",
    ]  # no attention_mask: it would disable packing
    assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].shape[1] <= 128
    model = trainer.model.eval()
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
    documents = 0
    for ids, labels, pos, row_logits in zip(
        batch["input_ids"], batch["labels"], batch["position_ids"], out
    ):
        real = int((ids != tok.pad_token_id).sum())
        starts = (pos[:real] == 0).nonzero().flatten().tolist()
        for s, e in zip(starts, starts[1:] + [real]):
            mask = expected[tuple(ids[s:e].tolist())]  # each packed document is one whole example
            assert (labels[s:e] != -100).tolist() == [bool(b) for b in mask]
            assert (row_logits[s:e] - logits(model, ids[s:e], use_cache=False)).abs().max() < 1e-4
            documents += 1
        assert (labels[real:] == -100).all()
    assert documents > 4  # rows hold more than one document


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
    metrics = train_sft(
        setup / "base",
        setup / "train.jsonl",
        tmp_path / "sft",
        params=params,
        threads=2,
        log=lines.append,
    )
    assert metrics["examples"] == 200 and metrics["steps"] == 60
    assert 0 < metrics["supervised_tokens"] < metrics["total_tokens"]
    assert metrics["final_loss"] < 0.3 * metrics["first_loss"], metrics
    assert metrics["tokens_per_second"] > 0 and 0.5 < metrics["packing_efficiency"] <= 1
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
        train_sft(setup / "base", path, tmp_path / "out", params={})
    assert not (tmp_path / "out").exists()


def test_examples_truncated_to_no_supervision_fail(setup, tmp_path):
    rows = synthetic_rows(3)
    rows[1]["messages"][-2]["content"] = "What is " + " + ".join(["1"] * 100) + "?"
    path = write_rows(tmp_path / "data.jsonl", rows)
    with pytest.raises(DataError, match=r"1 of 3 examples .* max_length=64 \(ids: ex-1\)"):
        train_sft(setup / "base", path, tmp_path / "out", params={"max_length": 64})


def test_unknown_param_raises(setup):
    with pytest.raises(ValueError, match="learning_rate"):
        check_params({"learning_rate": 1e-3})
    with pytest.raises(ValueError, match="max_length"):
        check_params({"max_length": 0})


def test_killed_training_resumes_to_the_same_weights(setup, tmp_path):
    """SIGKILL the real CLI after a checkpoint is written; the rerun resumes from it and ends where an
    uninterrupted run ends (same data order, optimizer and scheduler state, RNG)."""
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
