"""The SFT trainer: packed documents kept apart by restarting positions, in padded rows (sdpa) or
one flattened row (FlashAttention), and batches that label only assistant tokens."""

import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stillroom.config import Train
from stillroom.data.conversations import load_conversations
from stillroom.runtime.sft import (
    build_trainer,
    check_optimizer,
    collate_packed_rows,
    encode_examples,
)
from stillroom.runtime.templates import training_template

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
        return max((a - b).abs().max().item() for a, b in zip(alone, parts, strict=False))

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

    # FlashAttention's layout: the same rows flattened into one, which is the only shape in which it
    # reads
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
    assert (
        max((a - b).abs().max().item() for a, b in zip(alone, out.split(lengths), strict=False))
        < 1e-4
    )


def test_trainer_batches_label_only_assistant_tokens(setup, tmp_path):
    examples = load_conversations(setup / "train.jsonl")[:40]
    params = Train.parse(dict(batch_size=4, max_length=128), where="train")
    tok = AutoTokenizer.from_pretrained(setup / "base")
    encoded = encode_examples(tok, training_template(tok), examples)
    trainer = build_trainer(setup / "base", encoded, params, tmp_path / "trainer")
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
        batch["input_ids"], batch["labels"], batch["position_ids"], out, strict=False
    ):
        real = int((ids != tok.pad_token_id).sum())
        starts = (pos[:real] == 0).nonzero().flatten().tolist()
        for s, e in zip(starts, starts[1:] + [real], strict=False):
            mask = expected[tuple(ids[s:e].tolist())]  # each packed document is one whole example
            assert (labels[s:e] != -100).tolist() == [bool(b) for b in mask]
            assert (row_logits[s:e] - logits(model, ids[s:e], use_cache=False)).abs().max() < 1e-4
            documents += 1
        assert (labels[real:] == -100).all()
    assert documents > 4  # rows hold more than one document


def test_a_gpu_recipe_on_cpu_packs_with_sdpa_and_a_gpu_keeps_flash_attention():
    from stillroom.runtime.sft import attention

    flash = Train.parse(dict(attn_implementation="flash_attention_2"), where="train")
    assert attention(flash, cuda=False) == "sdpa"
    assert attention(flash, cuda=True) == "flash_attention_2"
    assert attention(Train.parse({}, where="train"), cuda=True) == "sdpa"


@pytest.mark.parametrize("optim, cls", [("adamw_torch", "AdamW"), ("sgd", "SGD")])
def test_train_optim_reaches_the_trainer(setup, tmp_path, optim, cls):
    examples = load_conversations(setup / "train.jsonl")[:16]
    params = Train.parse(
        dict(batch_size=2, max_length=128, max_steps=1, lr=1e-3, optim=optim), where="train"
    )
    tok = AutoTokenizer.from_pretrained(setup / "base")
    encoded = encode_examples(tok, training_template(tok), examples)
    trainer = build_trainer(setup / "base", encoded, params, tmp_path / "trainer")
    trainer.train()
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    assert type(optimizer) is getattr(torch.optim, cls)
    assert trainer.state.global_step == 1


def test_an_optimizer_whose_package_is_missing_is_refused_before_anything_loads(
    monkeypatch, tmp_path
):
    from stillroom.config import ConfigError
    from stillroom.runtime.sft import train_sft

    check_optimizer(Train.parse({"optim": "paged_adamw_8bit"}))  # bitsandbytes is installed
    monkeypatch.setitem(sys.modules, "torchao", None)  # as if it were not
    params = {"optim": "adamw_torch_4bit"}
    with pytest.raises(ConfigError, match=r"train.optim: adamw_torch_4bit needs the package "):
        check_optimizer(Train.parse(params))
    # the job stops on it before it reads the model or the dataset (neither exists here)
    with pytest.raises(ConfigError, match=r"needs the package torchao \(module torchao\), which"):
        train_sft(
            tmp_path / "no-model", tmp_path / "no.jsonl", tmp_path / "out", params=params, seed=0
        )
