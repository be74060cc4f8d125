"""The SFT loss is computed without the logits: TRL's SFTTrainer projects the final hidden states
through its fused LM head in tiles (trl.trainer.utils.add_fused_lm_head), a chunked loss like Cut
Cross Entropy, and keeps only per-token statistics. The training memory estimate counts it so
(stillroom/plan/estimate.py activation_bytes); here a step of the trainer is held to that, and its
loss and gradients to transformers' cross-entropy over whole logits."""

import pytest
import torch
from transformers import AutoTokenizer

from stillroom.config import Train
from stillroom.data.conversations import load_conversations
from stillroom.runtime.sft import build_trainer, encode_examples
from stillroom.runtime.templates import training_template

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def trainer_for(root, base, tmp_path, **train):
    tok = AutoTokenizer.from_pretrained(base)
    examples = load_conversations(root / "train.jsonl")[:24]
    encoded = encode_examples(tok, training_template(tok), examples)
    params = Train.parse(dict(batch_size=4, max_length=128, max_steps=1, **train), where="train")
    return build_trainer(base, encoded, params, tmp_path / "trainer")


def saved_shapes(step) -> list[tuple[int, ...]]:
    """Shapes of the tensors autograd keeps for the backward while ``step`` runs."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return shapes


def test_a_training_step_never_holds_the_logits(setup, tmp_path):
    """No tensor as wide as the vocabulary is kept for the backward but the LM head's weight,
    where transformers' own forward keeps the tokens x vocabulary log-softmax."""
    trainer = trainer_for(setup, setup / "base", tmp_path)
    model, vocab = trainer.model, trainer.model.config.vocab_size
    batch = next(iter(trainer.get_train_dataloader()))
    tokens = batch["input_ids"].numel()
    head = tuple(model.get_output_embeddings().weight.shape)
    fused = saved_shapes(lambda: trainer.compute_loss(model, dict(batch)))
    assert [s for s in fused if vocab in s and s != head] == []
    # the guard: the same batch through the model's own loss keeps a logits-sized tensor
    plain = saved_shapes(lambda: model(**batch, use_cache=False))
    wide = [s for s in plain if vocab in s and s != head]
    assert any(torch.Size(s).numel() >= tokens * vocab // 2 for s in wide), wide


@pytest.mark.parametrize(
    "fixture, train",
    [
        ("setup", {}),
        ("setup", {"method": "lora", "lora": LORA}),
        ("moe", {}),
        ("moe", {"method": "lora", "lora": LORA}),
    ],
    ids=["dense-full", "dense-lora", "moe-full", "moe-lora"],
)
def test_the_trainers_loss_and_gradients_are_whole_logits_cross_entropy(
    fixture, train, request, tmp_path
):
    """The trainer's loss on a packed batch (restarting positions, labels -100 off the assistant
    turns), normalised by the tokens of the whole accumulated step as transformers passes
    num_items_in_batch, and its gradients, equal transformers' cross-entropy over the whole
    logits: dense and MoE (with its router's load-balancing loss, a mean per micro-batch that
    both weigh by router_aux_loss_coef; TRL spreads it over the accumulated micro-batches), full
    and LoRA."""
    found = request.getfixturevalue(fixture)
    root = found if fixture == "setup" else found[0]
    trainer = trainer_for(root, root / "base", tmp_path, **train)
    model = trainer.model
    batch = next(iter(trainer.get_train_dataloader()))
    # as under gradient accumulation of 3 micro-batches: the step's tokens, not this one's
    steps = trainer.current_gradient_accumulation_steps = 3
    items = steps * int((batch["labels"][:, 1:] != -100).sum())
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    config = model.config
    assert trainer.aux_loss_enabled == (fixture == "moe")

    def whole_logits():
        out = model(**batch, use_cache=False, num_items_in_batch=items)
        if getattr(out, "aux_loss", None) is None:  # a dense model has none
            return out.loss
        return out.loss - config.router_aux_loss_coef * out.aux_loss * (1 - 1 / steps)

    def loss_and_grads(step):
        model.zero_grad()
        loss = step()
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in trained}

    fused, fused_grads = loss_and_grads(
        lambda: trainer.compute_loss(model, dict(batch), num_items_in_batch=items)
    )
    whole, whole_grads = loss_and_grads(whole_logits)
    assert fused == pytest.approx(whole, rel=1e-6)
    assert fused_grads.keys() == whole_grads.keys() and fused_grads
    for name, grad in fused_grads.items():
        torch.testing.assert_close(grad, whole_grads[name], rtol=1e-5, atol=1e-7, msg=name)
