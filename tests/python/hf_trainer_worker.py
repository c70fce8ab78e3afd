"""One rank of test_hf_trainer.py: transformers.Trainer over a torch.distributed backend.

Usage (under shoalrun or torchrun): hf_trainer_worker.py --backend NAME --out DIR [--seed N]

It follows the route docs/torch.md ("Hugging Face Trainer") documents: the
script makes the default process group itself (``init_process_group(NAME)``)
before ``TrainingArguments(use_cpu=True)``, without ``ddp_backend``; accelerate
sees the group and adopts it, and the Trainer wraps the model in DDP on it.

It trains a GPT-2 built from a config (random weights, seeded) on a synthetic
dataset for a few steps and writes DIR/rank<R>.json: what the Trainer set up
(the group's backend, DDP's group's backend, the parallel mode), the logged
losses (each the mean of the ranks' losses, gathered through the group), the
samples this rank trained on, and a digest of the trained weights. With a
backend other than gloo it then checks, after training (so nothing it does
can touch the run), what accelerate and transformers do with that name.
"""

import argparse
import hashlib
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)

SAMPLES, SEQ, VOCAB = 16, 16, 64
STEPS, BATCH = 4, 2  # 4 steps x 2 samples x 2 ranks: every sample once


def dataset(seed):
    """SAMPLES token sequences; sample i starts with token i, so a batch names its samples."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)
    ids[:, 0] = torch.arange(SAMPLES)
    return [{"input_ids": x, "labels": x.clone()} for x in ids]


class RecordingCollator:
    """The default collator, noting the samples of every batch this rank trains on."""

    def __init__(self):
        from transformers import default_data_collator
        self.collate = default_data_collator
        self.seen = []

    def __call__(self, features):
        batch = self.collate(features)
        self.seen.extend(batch["input_ids"][:, 0].tolist())
        return batch


def digest(model):
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def describe_error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (recorded for the test to judge)
        return f"{type(e).__name__}: {e}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()

    if a.backend == "shoal":
        import shoal.torch  # noqa: F401  (registers "shoal")
    elif a.backend == "smddp":
        import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  (registers "smddp")
    # The route: the group first (env:// from the launcher), then the Trainer.
    dist.init_process_group(backend=a.backend)

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    out = a.out
    args = TrainingArguments(output_dir=os.path.join(out, "trainer"), use_cpu=True, max_steps=STEPS,
                             per_device_train_batch_size=BATCH, learning_rate=1e-3, logging_steps=1,
                             save_strategy="no", report_to=[], disable_tqdm=True, seed=a.seed,
                             ddp_find_unused_parameters=False)
    torch.manual_seed(a.seed)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    collator = RecordingCollator()
    trainer = Trainer(model=model, args=args, train_dataset=dataset(a.seed), data_collator=collator)
    trainer.train()

    wrapped = trainer.model_wrapped
    group = getattr(wrapped, "process_group", None)
    rank = dist.get_rank()
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "group_backend": dist.get_backend(),
        "wrapper": type(wrapped).__name__,
        "ddp_group_backend": dist.get_backend(group) if group is not None else None,
        "parallel_mode": str(args.parallel_mode),
        "args_world_size": args.world_size,
        "accelerate_backend_label": args.distributed_state.backend,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "samples": collator.seen,
        "weights": digest(trainer.model),
    }

    if a.backend != "gloo":
        # What the pinned accelerate/transformers do with this backend's name.
        fields = TrainingArguments.__dataclass_fields__
        report["ddp_backend_choices"] = list(fields["ddp_backend"].metadata.get("choices", []))
        report["ddp_backend_error"] = describe_error(lambda: TrainingArguments(
            output_dir=os.path.join(out, "probe"), use_cpu=True, ddp_backend=a.backend, report_to=[]).device)
        report["without_use_cpu_parallel_mode"] = str(TrainingArguments(
            output_dir=os.path.join(out, "probe"), report_to=[]).parallel_mode)

    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: on the Gloo job (shoal not
    # even imported) a thread of the Hugging Face stack was once still
    # joinable there and aborted the rank ("terminate called without an
    # active exception") after its report was written. The process group
    # is destroyed above, so shoal's own shutdown has run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
