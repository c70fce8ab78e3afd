"""One rank of a job checking the rest of the SageMaker v1 surface that real scripts touch
(test_mp_api.py). Usage: mp_api_worker.py SUITE. Every check compares with a plain
single-process run where there is a number to compare.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.optim.optimizer import register_optimizer_step_pre_hook

import mp_models as M
import shoal.modelparallel as smp
from harness import Checks

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])


def close(got, want, what, rtol=1e-4, atol=1e-5):
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.allclose(got, want, rtol=rtol, atol=atol), \
        f"{what}: max difference {(got - want).abs().max().item():.3g}"


def batches(n=3, batch=8):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(batch, 8, generator=g), torch.randint(0, 4, (batch,), generator=g)) for _ in range(n)]


def reference(steps, clip=None):
    """The plain model trained in one process; the gradient norms clip_grad_norm_ saw (with `clip`)."""
    torch.manual_seed(0)
    ref = M.Chain(depth=4)
    norms = []

    def clip_first(opt, args, kwargs):
        if clip:
            norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip).item())
    handle = register_optimizer_step_pre_hook(clip_first)   # every optimizer: removed below
    try:
        M.train_plain(ref, steps)
    finally:
        handle.remove()
    return ref, norms


def pipeline(c):
    """2 partitions: the optimizer surface of a v1 script with fp16 off, state, cpu()."""
    def run():
        smp.init({"partitions": 2, "microbatches": 2, "tensor_parallel_degree": 1, "fp16": False,
                  "activation_loading_horizon": 4, "static_mode": False, "fast_mode": False})
        assert smp.state.cfg.partitions == 2 and smp.state.cfg.fp16 is False
        assert smp.state.cfg.prescaled_batch is False and smp.state.cfg.shard_optimizer_state is False
        torch.manual_seed(0)
        net = M.Chain(depth=4)
        model = smp.DistributedModel(net)
        assert model.get_module() is net
        model.to(torch.float64)                   # a dtype applies ...
        assert next(net.parameters()).dtype == torch.float64
        model.to(torch.float32).cuda()            # ... a device move is ignored (no CUDA here)
        # SageMaker's GPT-2 examples always pass the loss-scale arguments; with fp16 off they do nothing
        opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), static_loss_scale=None,
                                       dynamic_loss_scale=True,
                                       dynamic_loss_args={"scale_window": 1000, "min_scale": 1, "delayed_shift": 2})
        assert opt.optimizer is opt and opt.loss_scale == 1.0
        train_step = M.cross_entropy_step(smp)
        steps = batches()
        ref, ref_norms = reference(steps, clip=0.5)
        norms = []
        for x, y in steps:
            opt.zero_grad()
            train_step(model, x, y)
            norms.append(opt.clip_master_grads(0.5))
            opt.step()
            assert opt.overflow is False
        close(norms, ref_norms, "clip_master_grads: the global norm")
        sd = opt.local_state_dict(gather_if_shard=False)
        assert sd["_smp_is_partial"] is True
        with torch.no_grad():
            local = {n for n, _ in model.local_named_parameters()}
            full = model.cpu()                    # every partition's parameters, on every rank
        assert full is model
        for n, p in net.named_parameters():
            close(p, dict(ref.named_parameters())[n], f"cpu(): {n} (local {n in local})")
            assert p.device.type == "cpu" and p.numel() > 0
        try:
            train_step(model, *steps[0])
        except smp.SMPValidationError as e:
            assert "gathered to the CPU" in str(e), str(e)
        else:
            raise AssertionError("a step after model.cpu() ran")
    c.run("fp16-off optimizer surface, clip_master_grads, cpu()", run)

    def half_config_with_an_fp32_model():
        smp.init({"partitions": 2, "fp16": True})
        try:
            smp.DistributedModel(M.Chain(depth=4))
        except smp.SMPValidationError as e:
            assert "'fp16'" in str(e) and "smp.model_creation(dtype=torch.float16)" in str(e), str(e)
            assert f"rank {RANK}" in str(e), str(e)
        else:
            raise AssertionError("an fp32 model was accepted under fp16")
    c.run("an fp32 model under fp16 is refused on every rank", half_config_with_an_fp32_model)

    def join_refuses_fp16():
        smp.init({"partitions": 1, "fp16": True, "ddp": True})
        with smp.model_creation(dtype=torch.float16):
            model = smp.DistributedModel(M.Chain(depth=4))
        try:
            with model.join():
                pass
        except smp.SMPUnsupportedError as e:
            assert "float16" in str(e), str(e)
        else:
            raise AssertionError("join() accepted fp16")
    c.run("join() with fp16 is refused by name", join_refuses_fp16)


def one_stage(c):
    """1 partition x 2 replicas: the model called outside @smp.step, model.backward averaging over
    the replicas, and a DDP communication hook."""
    def run(hook):
        smp.init({"partitions": 1, "ddp": True})
        torch.manual_seed(0)
        net = M.Chain(depth=4)
        model = smp.DistributedModel(net)
        if hook:
            model.register_comm_hook(smp.get_dp_process_group(), default_hooks.fp16_compress_hook)
        opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1))
        steps = batches()
        ref, _ = reference(steps)
        b = steps[0][0].size(0) // smp.dp_size()
        r = smp.dp_rank()
        for x, y in steps:
            opt.zero_grad()
            loss = F.cross_entropy(model(x[r * b:(r + 1) * b]), y[r * b:(r + 1) * b])
            model.backward(loss)
            opt.step()
        tol = dict(rtol=2e-3, atol=2e-3) if hook else {}
        for n, p in net.named_parameters():
            close(p, dict(ref.named_parameters())[n], f"{n}", **tol)
    c.run("outside @smp.step, averaged over replicas", run, False)
    c.run("with an fp16-compression comm hook", run, True)


def delayed(c):
    """GPT-2 built under smp.delay_param_initialization on 2 partitions: every parameter starts on
    the meta device; after partitioning each rank holds its own partition's, initialised as the
    model initialises them, and the model trains."""
    def run():
        from transformers import GPT2Config, GPT2LMHeadModel
        smp.init({"partitions": 2, "microbatches": 2})
        cfg = GPT2Config(n_layer=4, n_embd=64, n_head=4, n_positions=32, vocab_size=128, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0)
        with smp.delay_param_initialization(enabled=True):
            net = GPT2LMHeadModel(cfg)
        assert all(p.is_meta for p in net.parameters()), "a parameter was built with memory"
        assert not any(b.is_meta for b in net.buffers()), "buffers must be built as usual"
        model = smp.DistributedModel(net)
        opt = smp.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=3e-3))

        @smp.step
        def train_step(model, ids):
            loss = model(input_ids=ids, labels=ids)["loss"]
            model.backward(loss)
            return loss
        ids = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(0))
        losses = []
        for k in range(12):
            opt.zero_grad()
            losses.append(train_step(model, ids).reduce_mean().item())
            if k == 0:
                local = dict(model.local_named_parameters())
                assert local, "no local parameters"
                for n, p in net.named_parameters():
                    assert not p.is_meta, f"{n} is still on the meta device"
                    if n not in local:
                        assert p.numel() == 0, f"{n} of the other partition holds memory"
                for n, p in local.items():
                    assert torch.isfinite(p).all(), n
                    if n.endswith("c_attn.weight"):       # Conv1D: normal(0, initializer_range)
                        assert abs(p.std().item() - cfg.initializer_range) < 0.004, (n, p.std().item())
                    if n.endswith("ln_1.weight"):
                        assert torch.equal(p, torch.ones_like(p)), n
            opt.step()
        assert losses[-1] < 0.7 * losses[0], losses
    c.run("GPT-2 under delay_param_initialization", run)


def uneven(c):
    """1 partition x 2 replicas, replica 0 with 3 batches and replica 1 with 2, inside model.join():
    replica 1 shadows the third step's averaging, dividing by 2 replicas (or by the 1 that stepped)."""
    def run(divide_by_initial):
        smp.init({"partitions": 1, "ddp": True})
        shards = {r: batches(3 - r, 4) if r == 0 else batches(5, 4)[3:] for r in range(2)}
        torch.manual_seed(0)
        ref = M.Chain(depth=4)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for k in range(3):
            ropt.zero_grad()
            active = [r for r in range(2) if k < len(shards[r])]
            loss = sum(F.cross_entropy(ref(shards[r][k][0]), shards[r][k][1]) for r in active)
            (loss / (2 if divide_by_initial else len(active))).backward()
            ropt.step()
        torch.manual_seed(0)
        net = M.Chain(depth=4)
        model = smp.DistributedModel(net)
        opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1))
        train_step = M.cross_entropy_step(smp)
        with model.join(divide_by_initial_world_size=divide_by_initial):
            for x, y in shards[smp.dp_rank()]:
                opt.zero_grad()
                train_step(model, x, y)
                opt.step()
        for n, p in net.named_parameters():
            close(p, dict(ref.named_parameters())[n], n)
    c.run("join(), dividing by every replica", run, True)
    c.run("join(), dividing by the replicas that stepped", run, False)


SUITES = {"pipeline": pipeline, "one_stage": one_stage, "delayed": delayed, "uneven": uneven}


def main():
    c = Checks()
    SUITES[sys.argv[1]](c)
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
