"""One rank of a model-parallel job on an accelerator: the test device "fakegpu", or CUDA
(tests/gpu: SHOAL_TEST_DEVICE=cuda). Usage: mp_device_worker.py SUITE[:ARG] ...

Suites:
- ``place:P``: P partitions over the world (ddp when it has replicas), both schedules, auto
  and manual placement: the model is built on the CPU (and `.to()`-moved, which smp ignores),
  each rank sets its device as a SageMaker script does; losses and parameters equal a plain
  fp32 run on the CPU; every local parameter and gradient, and every input a module of the
  partition receives (received activations), is on the rank's device; other partitions'
  parameters are empty.
- ``half``: GPT-2 (small config, random weights) with fp16 and with bf16 against fp32, 2
  partitions, DistributedOptimizer with dynamic loss scaling and clip_master_grads: the losses
  stay within a stated bound of fp32's over the steps; fp32 master weights.
- ``overflow``: an inf injected in one partition's gradient: every rank skips that step
  (parameters unchanged, `.overflow` true), and the loss scales stay equal on every rank.
"""

import os
import sys

import torch

if os.environ.get("SHOAL_TEST_DEVICE", "fakegpu") == "fakegpu":
    import fakegpu
    fakegpu.load()
    DEVICE_TYPE = "fakegpu"
else:
    DEVICE_TYPE = "cuda"

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mp_models as M  # noqa: E402
import shoal.modelparallel as smp  # noqa: E402
from harness import Checks  # noqa: E402

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))


def device():
    n = torch.accelerator.device_count()
    return torch.device(DEVICE_TYPE, LOCAL % n)


def close(got, want, what, rtol=1e-4, atol=1e-5):
    got, want = torch.as_tensor(got).double().cpu(), torch.as_tensor(want).double().cpu()
    if not torch.allclose(got, want, rtol=rtol, atol=atol):
        raise AssertionError(f"{what}: max difference {(got - want).abs().max().item():.3g}")


def set_device():
    """What a SageMaker script does after smp.init: torch.cuda.set_device(smp.local_rank())."""
    torch.accelerator.set_device_index(smp.local_rank() % torch.accelerator.device_count())


def data(steps=3, batch=8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 8, generator=g), torch.randint(0, 4, (batch,), generator=g)) for _ in range(steps)]


def place(c, partitions):
    dp = WS // partitions
    for pipeline in ("simple", "interleaved"):
        for auto in (True, False):
            name = f"{partitions}x{dp} {pipeline} {'auto' if auto else 'manual'}"
            c.run(name, train_on_device, partitions, pipeline, auto)


def train_on_device(partitions, pipeline, auto):
    cfg = {"partitions": partitions, "microbatches": 2, "pipeline": pipeline, "auto_partition": auto,
           "ddp": WS // partitions > 1}
    smp.init(cfg)
    set_device()
    dev = device()

    def make():
        torch.manual_seed(0)
        return M.Chain(depth=4) if auto else M.Manual(smp, partitions, depth=4)
    ref = make()
    batches = data()
    ref_losses = M.train_plain(ref, batches)

    net = make()
    model = smp.DistributedModel(net)
    model.to(dev)                   # ignored: the library places the partitions
    assert all(p.device.type == "cpu" for p in net.parameters()), "a .to() before partitioning moved the model"
    opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    seen = []

    def check_inputs(mod, args):
        if smp.is_tracing():     # rank 0 measuring the model for the partitioner, where the model still is
            return
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type != "meta":    # (meta: smp tracing shapes)
                seen.append(a.device)
    handles = [m.register_forward_pre_hook(check_inputs) for m in net.modules()]
    train_step = M.cross_entropy_step(smp)

    losses = []
    r, b = smp.dp_rank(), batches[0][0].size(0) // smp.dp_size()
    for x, y in batches:
        opt.zero_grad()
        # the batch comes from a CPU data loader, as in SageMaker's examples
        lm = train_step(model, x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]).reduce_mean()
        for n, p in model.local_named_parameters():
            assert p.device == dev, f"local parameter {n} is on {p.device}, not {dev}"
            assert p.grad is not None and p.grad.device == dev, f"gradient of {n}: {p.grad}"
        opt.step()
        t = lm.detach().reshape(1).to(dev)
        dist.all_reduce(t, group=smp.get_dp_process_group())
        losses.append(t.item() / smp.dp_size())
    for h in handles:
        h.remove()
    assert seen and all(d == dev for d in seen), f"module inputs on {set(map(str, seen))}, expected {dev}"
    local = {n for n, _ in model.local_named_parameters()}
    for n, p in net.named_parameters():
        if n not in local:
            assert p.numel() == 0 and p.device == dev, f"{n} of another partition: {p.shape} on {p.device}"
    close(losses, ref_losses, "losses")
    sd = model.state_dict()
    for k, v in ref.state_dict().items():
        close(sd[k], v, f"parameter {k}")
    if pipeline == "simple" and auto:   # a partial checkpoint saved from the device and resumed onto it
        d = os.path.join(os.environ["TEST_CKPT_DIR"], f"{partitions}x{WS // partitions}")
        smp.save_checkpoint(d, "dev", partial=True, model=model, optimizer=opt)
        saved = {n: p.detach().clone() for n, p in model.local_named_parameters()}
        with torch.no_grad():
            for p in model.local_parameters():
                p.zero_()
        smp.resume_from_checkpoint(d, tag="dev", partial=True)
        for n, p in model.local_named_parameters():
            assert p.device == dev, f"resumed {n} is on {p.device}"
            close(p, saved[n], f"resumed {n}")


def gpt2(dtype):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=128, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    with smp.model_creation(dtype=dtype):
        return GPT2LMHeadModel(cfg)


def run_gpt2(cfg, dtype, steps):
    smp.init(cfg)
    set_device()
    model = smp.DistributedModel(gpt2(dtype))
    opt = smp.DistributedOptimizer(torch.optim.Adam(model.get_module().parameters(), lr=3e-3),
                                   static_loss_scale=None, dynamic_loss_scale=True,
                                   dynamic_loss_args={"init_scale": 2.0 ** 12, "scale_window": 10, "min_scale": 1,
                                                      "delayed_shift": 2})

    @smp.step
    def train_step(model, ids):
        loss = model(input_ids=ids, labels=ids)["loss"]
        model.backward(loss)
        return loss

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 128, (4, 32), generator=g)     # one batch, learnt over the steps
    losses, skipped = [], 0
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = train_step(model, ids).reduce_mean()
        opt.clip_master_grads(1.0)
        opt.step()
        skipped += bool(opt.overflow)
        losses.append(float(loss.float().item()))
    if dtype != torch.float32:
        masters = [m for g_ in opt.param_groups for m in g_["params"] if m.numel()]
        assert masters and all(m.dtype == torch.float32 for m in masters), "masters are not float32"
        assert all(p.dtype == dtype for p in model.local_parameters()), "the model is not half precision"
    return losses, skipped


def half(c):
    steps = int(os.environ.get("SHOAL_TEST_HALF_STEPS", "50"))
    base = {"partitions": 2, "microbatches": 2, "pipeline": "interleaved"}
    ref, _ = run_gpt2(base, torch.float32, steps)
    if RANK == 1:
        print(f"fp32 losses: {ref[0]:.4f} -> {ref[-1]:.4f}", flush=True)

    def compare(key, dtype, bound):
        got, skipped = run_gpt2({**base, key: True}, dtype, steps)
        worst = max(abs(a - b) for a, b in zip(got, ref))
        if RANK == 1:
            print(f"{key}: losses {got[0]:.4f} -> {got[-1]:.4f}, worst |loss - fp32 loss| {worst:.4f}, "
                  f"{skipped} steps skipped", flush=True)
        assert worst < bound, f"{key}: a loss differs from fp32's by {worst:.4f} (bound {bound})"
        assert got[-1] < got[0] * 0.5, f"{key}: did not learn ({got[0]:.3f} -> {got[-1]:.3f})"
    # stated bounds: the largest gap to fp32's loss over the steps (losses start near ln(128) = 4.85)
    c.run("fp16 within 0.05 of fp32", compare, "fp16", torch.float16, 0.05)
    c.run("bf16 within 0.1 of fp32", compare, "bf16", torch.bfloat16, 0.1)


def overflow(c):
    def check():
        smp.init({"partitions": 2, "microbatches": 2, "fp16": True})
        set_device()
        dev = device()
        torch.manual_seed(0)
        with smp.model_creation(dtype=torch.float16):
            net = M.Chain(depth=4)
        model = smp.DistributedModel(net)
        opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), dynamic_loss_scale=True,
                                       dynamic_loss_args={"init_scale": 1024.0})

        @smp.step
        def train_step(model, x, y):
            loss = F.cross_entropy(model(x).float(), y)
            model.backward(loss)
            return loss
        x, y = data(1)[0]
        scales, flags = [], []
        for k in range(3):
            opt.zero_grad()
            train_step(model, x.half(), y)
            if k == 1 and smp.pp_rank() == 1:      # one partition's gradient overflows
                next(model.local_parameters()).grad.view(-1)[0] = float("inf")
            before = [p.detach().clone() for p in model.local_parameters()]
            opt.step()
            after = list(model.local_parameters())
            changed = any(not torch.equal(a, b) for a, b in zip(before, after))
            assert changed != opt.overflow, f"step {k}: overflow {opt.overflow} but parameters changed {changed}"
            flags.append(opt.overflow)
            scales.append(opt.loss_scale)
        assert flags == [False, True, False], f"overflow flags {flags}"
        assert scales[1] == scales[0] / 2, f"scales {scales}: the overflow did not halve the scale"
        got = [None] * WS
        dist.all_gather_object(got, scales)
        assert all(g == scales for g in got), f"loss scales differ between ranks: {got}"
        assert all(p.device == dev for p in model.local_parameters())
    c.run("an overflow on one partition skips the step everywhere", check)


SUITES = {"place": place, "half": half, "overflow": overflow}


def main():
    c = Checks()
    for spec in sys.argv[1:]:
        name, _, arg = spec.partition(":")
        c.prefix = f"{spec}: "
        SUITES[name](c, *([int(arg)] if arg else []))
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
