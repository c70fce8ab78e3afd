#!/usr/bin/env python3
"""GPT-2 pretraining written against the SageMaker model-parallel library v1 (PyTorch), as
SageMaker's GPT-2 examples are written, running on shoal.

    build/bin/shoalrun --standalone --nproc-per-node 2 examples/smp_gpt2.py --fp16 1

The model is split into ``--pipeline-parallel-degree`` partitions, each batch into
``--microbatches``; with ``--tensor-parallel-degree`` > 1 it is built inside
``smp.model_creation(tensor_parallelism=True)``, so that wrapping it turns the GPT-2 into
``smp.nn.DistributedTransformerLMHead`` (attention, MLP, embedding and head split over the
tensor-parallel ranks; its blocks are ``transformer.seq_layers``); the other processes are
data-parallel replicas (``ddp``), optionally with ``--shard-optimizer-state``. What a v1 script relies on is used the way
v1 scripts use it: the SMP config with every key of the examples' (features off included),
``smp.model_creation(dtype=...)`` for fp16/bf16, ``smp.nn.FusedLayerNorm`` in place of the
model's LayerNorms, ``torch.cuda.set_device(smp.local_rank())`` on a GPU, the batch taken
from a CPU data loader, ``smp.set_activation_checkpointing`` on every transformer block,
``smp.DistributedOptimizer(..., dynamic_loss_scale=True, dynamic_loss_args={...})``,
``optimizer.clip_master_grads``, skipping the LR schedule on ``optimizer.overflow``, and
``smp.save_checkpoint`` / ``smp.resume_from_checkpoint`` (partial) with the step count in
the user content.

The data is synthetic (no download): sequences of a fixed random permutation of the
vocabulary, each starting at a random token, so the next token is learnable. The exit
status is 1 when the last loss of a fresh run is not below half its first (--min-drop).
"""

import argparse
import math
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import smdistributed.modelparallel
import smdistributed.modelparallel.torch as smp
from smdistributed.modelparallel.torch.nn import FusedLayerNorm


# (flag, type, default, help): the SageMaker example's options that matter here
OPTIONS = [
    ("--pipeline-parallel-degree", int, 2, "partitions"),
    ("--tensor-parallel-degree", int, 1, "ranks sharing each tensor-parallel module"),
    ("--prescaled-batch", int, 0, "the tensor-parallel ranks read the same batch"),
    ("--shard-optimizer-state", int, 0, "each data-parallel rank keeps 1/n of the optimizer state"),
    ("--microbatches", int, 4, "microbatches per batch"),
    ("--fp16", int, 1, "half-precision parameters, fp32 master weights, dynamic loss scaling"),
    ("--bf16", int, 0, "bfloat16 instead"),
    ("--activation-checkpointing", int, 1, "checkpoint every transformer block"),
    ("--steps", int, 30, "training steps"),
    ("--batch-size", int, 8, "sequences per data-parallel replica"),
    ("--seq-len", int, 64, "tokens per sequence"),
    ("--vocab", int, 256, "vocabulary size"),
    ("--layers", int, 4, "transformer blocks"),
    ("--width", int, 128, "hidden size"),
    ("--lr", float, 3e-3, "AdamW learning rate"),
    ("--grad-clip", float, 1.0, "clip_master_grads max norm"),
    ("--checkpoint-dir", str, "", "where partial checkpoints go"),
    ("--resume", int, 0, "resume from the newest partial checkpoint"),
    ("--log-every", int, 5, "steps between loss lines"),
    ("--min-drop", float, 0.5, "a fresh run's last loss must be below this times its first"),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, kind, default, what in OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=what)
    return p.parse_args()


def batches(args, start_step):
    """The batches of this data-parallel rank (of its tensor-parallel group with prescaled batches), from
    a CPU 'loader', from `start_step` on."""
    rank, size = (smp.rdp_rank(), smp.rdp_size()) if args.prescaled_batch else (smp.dp_rank(), smp.dp_size())
    g = torch.Generator().manual_seed(1234)
    perm = torch.randperm(args.vocab, generator=g)
    step = 0
    while True:
        starts = torch.randint(0, args.vocab, (args.batch_size * size,), generator=g)
        if step >= start_step:
            mine = starts[rank * args.batch_size:(rank + 1) * args.batch_size]
            pos = (mine[:, None] + torch.arange(args.seq_len)[None, :]) % args.vocab
            yield perm[pos]
        step += 1


def use_fused_layernorm(module: torch.nn.Module) -> None:
    """Every nn.LayerNorm of the model becomes smp.nn.FusedLayerNorm (same parameters)."""
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.LayerNorm):
            fused = FusedLayerNorm(child.normalized_shape, eps=child.eps)
            fused.to(child.weight.dtype)
            fused.load_state_dict(child.state_dict())
            setattr(module, name, fused)
        else:
            use_fused_layernorm(child)


def param_groups(module, weight_decay=0.01):
    """No weight decay for biases and layer-norm parameters (as the SageMaker examples do)."""
    decay, no_decay, seen = [], [], set()
    for m in module.modules():
        for n, p in m._parameters.items():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            (no_decay if isinstance(m, torch.nn.LayerNorm) or n == "bias" else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@smp.step
def train_step(model, input_ids):
    loss = model(input_ids=input_ids, labels=input_ids)["loss"]
    model.backward(loss)
    return loss


def main():
    args = parse_args()
    smp.init({
        "ddp": True, "tensor_parallel_degree": args.tensor_parallel_degree,
        "pipeline_parallel_degree": args.pipeline_parallel_degree, "microbatches": args.microbatches,
        "shard_optimizer_state": args.shard_optimizer_state > 0, "prescaled_batch": args.prescaled_batch > 0,
        "fp16": args.fp16 > 0, "bf16": args.bf16 > 0, "offload_activations": False,
        "delayed_parameter_initialization": False, "optimize": "speed", "placement_strategy": "cluster",
        "activation_loading_horizon": 4, "skip_tracing": False, "auto_partition": True, "default_partition": 0,
        "static_mode": False, "fast_mode": False, "sharded_data_parallel_degree": 1, "ddp_dist_backend": "auto",
        "sdp_hierarchical_allgather": False, "sdp_gradient_clipping": args.grad_clip,
    })
    if smp.rank() == 0:
        print(f"smdistributed.modelparallel {smdistributed.modelparallel.__version__}: {smp.size()} ranks, "
              f"{smp.pp_size()} partitions x tensor-parallel {smp.tp_size()} x {smp.rdp_size()} replicas",
              flush=True)
    if torch.cuda.is_available():
        torch.cuda.set_device(smp.local_rank())

    dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.get_default_dtype()
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.seq_len, n_embd=args.width, n_layer=args.layers,
                        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    torch.manual_seed(0)
    with smp.model_creation(tensor_parallelism=smp.tp_size() > 1, dtype=dtype):
        model = GPT2LMHeadModel(config)
        use_fused_layernorm(model)

    model = smp.DistributedModel(model, trace_device="gpu")
    m = model.get_module()
    blocks = m.transformer.seq_layers if smp.tp_size() > 1 else m.transformer.h
    if args.activation_checkpointing:
        for block in blocks.children():
            smp.set_activation_checkpointing(block)

    optimizer = torch.optim.AdamW(param_groups(m), lr=args.lr, betas=(0.9, 0.95))
    optimizer = smp.DistributedOptimizer(optimizer, static_loss_scale=None, dynamic_loss_scale=True,
                                         dynamic_loss_args={"scale_window": 1000, "min_scale": 1,
                                                            "delayed_shift": 2, "init_scale": 2.0 ** 16})
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))

    total_steps = 0
    if args.resume:
        user_content = smp.resume_from_checkpoint(args.checkpoint_dir, partial=True)
        total_steps = user_content["total_steps"]
        lr_scheduler.load_state_dict(user_content["lr_scheduler"])
        if smp.rank() == 0:
            print(f"resumed at step {total_steps}", flush=True)

    first = last = None
    skipped = 0
    t0 = time.time()
    data = batches(args, total_steps)
    for _ in range(args.steps):
        input_ids = next(data)
        optimizer.zero_grad(set_to_none=True)
        loss = train_step(model, input_ids).reduce_mean()
        optimizer.clip_master_grads(args.grad_clip)
        optimizer.step()
        if not ((args.fp16 or args.bf16) and optimizer.overflow):
            lr_scheduler.step()
        skipped += bool(optimizer.overflow)
        total_steps += 1
        value = float(loss.float().item())
        if not math.isfinite(value):
            continue
        first = value if first is None else first
        last = value
        if smp.rank() == 0 and (total_steps % args.log_every == 0):
            print(f"step {total_steps}: loss {value:.4f} (loss scale {optimizer.loss_scale:g}, {skipped} steps "
                  f"skipped, {(time.time() - t0) / total_steps:.2f} s/step)", flush=True)

    if args.checkpoint_dir:
        smp.save_checkpoint(args.checkpoint_dir, tag=f"step{total_steps}", partial=True, model=model,
                            optimizer=optimizer,
                            user_content={"total_steps": total_steps, "lr_scheduler": lr_scheduler.state_dict()})
    # a fresh run must learn; a resumed one continues where the checkpoint left off (its first loss
    # is the checkpoint's, far below a fresh model's ln(vocab))
    ok = first is not None and (args.resume or last < args.min_drop * first)
    if smp.rank() == 0:
        print(f"done: {total_steps} steps, loss {first:.4f} -> {last:.4f} ({'ok' if ok else 'did not learn'})",
              flush=True)
    smp.barrier()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
