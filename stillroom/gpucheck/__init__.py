"""A one-shot GPU check (``make gpu-check``): the code paths that cannot run on the CPU machines,
exercised once on one GPU (the flagship on all of them) within about 8 minutes, with a JSON
summary.

Checks, each in a process of its own with its own time limit under one overall deadline, so that a
hang, a crash or a poisoned CUDA context in one is recorded and the next still runs:

- ``sft``: bf16 SFT of a small random Qwen3 on the same documents in packed rows (restarting
  position_ids; FlashAttention 2 when flash-attn is importable, else sdpa) and in padded rows, from
  the same weights: per-step losses, the step-0 loss difference (beside that of a packing whose
  documents see each other, the leak it must catch), tokens/s of each; then the production
  trainer (runtime/sft.py ``build_trainer``) for a few steps.
- ``qlora``: an NF4 base with LoRA through the same trainer: loss, adapter gradients, memory.
- ``qlora_fsdp_staged``: the flagship recipe on a tiny Qwen3-MoE: the train stage with every
  weight matrix in NF4 (fused experts included, the staged loader), LoRA on attention and the
  fused experts, FSDP2 over every GPU found (one process on one GPU), a few steps; then the
  streaming merge of the adapter into the base in a process of its own. Losses, tokens/s, peak
  GPU memory per rank, NF4 tensors, the merge's peak RSS and seconds, the router unchanged, the
  merged logits against the base with the adapter in PEFT.
- ``evaluate``: the evaluate stage with the ``hf`` backend on the GPU; samples written, timing.
- ``kernels``: every reference solution compiled by Triton on the GPU through the kernel reward
  (``stillroom.grading.kernel.score_answer``), with its speedup over the PyTorch reference.

Without a CUDA device it writes a ``skipped`` summary and exits 0. ``--device cpu`` runs the same
checks on CPU at toy sizes (Triton's interpreter, sdpa, float32; the flagship on 2 gloo ranks), for
developing the check itself.

    python -m stillroom.gpucheck [--out results/gpu-check.json] [--checks sft,qlora,...]
"""
