"""One rank of a model-parallel test job (see harness.py). Usage: mp_worker.py SUITE[:ARG] ...

Every check trains (or evaluates) a model with shoal.modelparallel and the same
model as a plain single-process module on the same data (every rank computes
that reference itself), and compares losses and parameters. Checks record
failures and go on; each prints its outcome in the RESULT line.
"""

import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mp_models as M  # noqa: E402
import shoal.modelparallel as smp  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=FutureWarning)

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
SUITES = {}


def suite(name):
    def reg(fn):
        SUITES[name] = fn
        return fn
    return reg


from harness import Checks  # noqa: E402


def close(got, want, what, rtol=1e-4, atol=1e-5):
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not torch.allclose(got, want, rtol=rtol, atol=atol):
        diff = (got - want).abs().max().item()
        raise AssertionError(f"{what}: max difference {diff:.3g}\n got {got.flatten()[:6]}\n"
                             f"want {want.flatten()[:6]}")


def same_state(sd, ref_sd, what, atol=1e-5):
    assert set(sd) == set(ref_sd), f"{what}: keys differ: {set(sd) ^ set(ref_sd)}"
    for k, v in ref_sd.items():
        close(sd[k], v, f"{what}: {k}", rtol=1e-4, atol=atol)


def dp_mean(x):
    t = torch.as_tensor(x, dtype=torch.float64).reshape(1).clone()
    dist.all_reduce(t, group=smp.get_dp_process_group())
    return t.item() / smp.dp_size()


# ----------------------------------------------------------------- training against the reference

def train_and_compare(name, make_model, cfg, data, loss_fn, make_opt, *, scaler=None, clip=None):
    """Trains with smp and a plain reference on `data` (global batches); compares."""
    smp.init(cfg)
    torch.manual_seed(0)
    ref = make_model()
    torch.manual_seed(0)
    net = make_model()
    ropt = make_opt(ref.parameters())
    rscaler = torch.amp.GradScaler("cpu", init_scale=scaler) if scaler else None
    ref_losses, ref_norms = [], []
    for x, y in data:
        ropt.zero_grad()
        loss = loss_fn(ref(x), y)
        (rscaler.scale(loss) if rscaler else loss).backward()
        if rscaler:
            rscaler.unscale_(ropt)
        if clip:
            ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip).item())
        if rscaler:
            rscaler.step(ropt)
            rscaler.update()
        else:
            ropt.step()
        ref_losses.append(loss.item())

    model = smp.DistributedModel(net)
    opt = smp.DistributedOptimizer(make_opt(net.parameters()))
    sc = smp.amp.GradScaler(init_scale=scaler) if scaler else None

    @smp.step
    def train_step(model, x, y):
        out = model(x)
        loss = loss_fn(out, y)
        model.backward(sc.scale(loss) if sc else loss)
        return loss

    losses, norms = [], []
    dp, r = smp.dp_size(), smp.dp_rank()
    for x, y in data:
        b = x.size(0) // dp
        opt.zero_grad()
        lm = train_step(model, x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]).reduce_mean()
        if sc:
            sc.unscale_(opt)
        if clip:
            norms.append(smp.clip_grad_norm_(model.parameters(), clip).item())
        if sc:
            sc.step(opt)
            sc.update()
        else:
            opt.step()
        losses.append(dp_mean(lm))
    close(losses, ref_losses, f"{name}: losses")
    if clip:
        close(norms, ref_norms, f"{name}: gradient norms")
    if sc:
        close(sc.get_scale(), rscaler.get_scale(), f"{name}: loss scale")
    same_state(model.state_dict(), ref.state_dict(), f"{name}: parameters")
    return model, opt, ref


def chain_check(cfg, depth=4, steps=3, batch=8, opt="sgd"):
    dp = WS // cfg["partitions"]
    make_opt = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2)}[opt]
    return lambda: train_and_compare(f"chain {cfg}", lambda: M.Chain(depth=depth), cfg,
                                     M.chain_data(steps, batch * dp), F.cross_entropy, make_opt)


def accumulation_check(base, depth=4, pairs=2, batch=8):
    """backward_passes_per_step=2 against a plain module that backpropagates two
    batches before each optimizer step; between the two steps the DP replicas'
    gradients must differ (no average ran), after the second they agree."""
    cfg = {**base, "pipeline": "interleaved"}
    smp.init(cfg)
    dp, r = smp.dp_size(), smp.dp_rank()
    data = M.chain_data(2 * pairs, batch * dp)
    torch.manual_seed(0)
    ref = M.Chain(depth=depth)
    torch.manual_seed(0)
    net = M.Chain(depth=depth)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for k in range(0, len(data), 2):
        ropt.zero_grad()
        for x, y in data[k:k + 2]:
            F.cross_entropy(ref(x), y).backward()
        ropt.step()

    model = smp.DistributedModel(net, backward_passes_per_step=2)
    opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))

    @smp.step
    def train_step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        return loss

    def grad_sum():
        return sum(float(p.grad.double().sum()) for p in model.local_parameters() if p.grad is not None)

    def spread(v):  # max - min of v over the DP group
        t = torch.tensor([v, -v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=smp.get_dp_process_group())
        return t[0].item() + t[1].item()

    for k in range(0, len(data), 2):
        opt.zero_grad()
        for j, (x, y) in enumerate(data[k:k + 2]):
            b = x.size(0) // dp
            train_step(model, x[r * b:(r + 1) * b], y[r * b:(r + 1) * b])
            d = spread(grad_sum())
            if j == 0:
                assert d > 1e-6, f"step {k}: replicas' gradients agree after a non-syncing step (spread {d})"
            else:
                assert d < 1e-6 * max(1.0, abs(grad_sum())), f"step {k + 1}: replicas disagree by {d}"
        opt.step()
    same_state(model.state_dict(), ref.state_dict(), "accumulation: parameters")
    try:
        smp.DistributedModel(M.Chain(depth=depth), backward_passes_per_step=0)
        raise AssertionError("backward_passes_per_step=0 was accepted")
    except smp.SMPValidationError as e:
        assert "backward_passes_per_step" in str(e), e


@suite("train")
def train(c, p):
    """p: the number of partitions. Both schedules, auto and manual placement."""
    p = int(p)
    dp = WS // p
    ddp = dp > 1
    base = {"partitions": p, "ddp": ddp, "microbatches": 4}
    c.run("chain auto interleaved", chain_check({**base, "pipeline": "interleaved"}, depth=2 * p))
    c.run("chain auto simple adam", chain_check({**base, "pipeline": "simple"}, depth=2 * p, opt="adam"))

    def manual():
        cfg = {**base, "auto_partition": False, "default_partition": 0, "pipeline": "interleaved",
               "placement_strategy": "spread" if ddp else "cluster"}
        smp.init(cfg)
        model, _, _ = train_and_compare(f"manual {cfg}", lambda: M.Manual(smp, p, depth=2 * p), cfg,
                                        M.chain_data(3, 8 * dp), F.cross_entropy,
                                        lambda ps: torch.optim.SGD(ps, lr=0.1))
        pl = model._smp.rt.pl
        want = {"inp": 0, "out": p - 1}
        for k, v in want.items():
            assert pl.unit_part[k] == v, f"manual placement: {k} on {pl.unit_part[k]}, want {v}"
        owned = [n for n, _ in model.local_named_parameters()]
        assert owned and all(pl.owner[n] == smp.pp_rank() for n in owned), owned
    c.run("chain manual (smp.partition)", manual)

    def gpt():
        cfg = {**base, "microbatches": 2, "pipeline": "interleaved", "optimize": "speed"}
        model, _, _ = train_and_compare(f"gpt {cfg}", lambda: M.TinyGPT(layers=2 * p), cfg,
                                        M.text_data(3, 4 * dp, [6, 9, 5]), M.lm_loss,
                                        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
        rt = model._smp.rt
        assert rt.pl.unit_part["head"] == rt.pl.unit_part["tok"], "tied modules on different partitions"
        nseg = max(len(pl.segments) for pl in rt.plans.values())
        assert nseg > p, f"tied embeddings: expected a non-contiguous plan, got {nseg} segments"
    c.run("gpt tied, variable length", gpt)

    if ddp:
        c.run("gradient accumulation (backward_passes_per_step=2)", accumulation_check, base)

    if p == 2 and dp == 1:
        c.run("branchy nested values", lambda: train_and_compare(
            "branchy", M.Branchy, {**base, "pipeline": "simple"}, M.chain_data(3, 8), F.cross_entropy,
            lambda ps: torch.optim.SGD(ps, lr=0.05)))
        c.run("chain 1 microbatch", chain_check({**base, "microbatches": 1}))
        c.run("masked LM (buffer sliced by the input's length)", lambda: train_and_compare(
            "masked lm", lambda: M.MaskedLM(layers=2), {**base, "pipeline": "interleaved"},
            M.text_data(3, 4, [6, 9]), M.lm_loss, lambda ps: torch.optim.SGD(ps, lr=0.1)))


# ----------------------------------------------------------------- features

@suite("features")
def features(c):
    cfg = {"partitions": 2, "microbatches": 2, "pipeline": "interleaved", "ddp": WS > 2}

    def ranks_and_alias():
        smp.init(cfg)
        import smdistributed.modelparallel.torch as smp2
        assert smp2 is smp and smp2.amp is smp.amp
        assert (smp.rank(), smp.size()) == (RANK, WS)
        assert smp.pp_size() == smp.mp_size() == 2 and smp.pp_rank() == smp.mp_rank() == RANK % 2
        assert smp.dp_size() == WS // 2 and smp.dp_rank() == RANK // 2
        assert smp.get_mp_group() == [RANK // 2 * 2, RANK // 2 * 2 + 1]
        assert smp.local_rank() == RANK and smp.local_size() == WS
        for g in (smp.get_mp_process_group(), smp.get_dp_process_group(), smp.get_world_process_group()):
            assert g is not None
    c.run("rank queries and the smdistributed alias", ranks_and_alias)

    def helpers():
        smp.init(cfg)
        if smp.pp_rank() == 0:
            smp.send({"t": torch.arange(5), "s": "hi"}, 1, smp.RankType.MP_RANK)
            got = smp.recv_from(1, smp.RankType.MP_RANK)
            assert got == ("back", 1), got
        else:
            got = smp.recv_from(0, smp.RankType.MP_RANK)
            assert torch.equal(got["t"], torch.arange(5)) and got["s"] == "hi"
            smp.send(("back", 1), 0, smp.RankType.MP_RANK)
        if RANK == 0:
            smp.broadcast([1, 2, torch.ones(3)], smp.CommGroup.WORLD)
        else:
            got = smp.recv_from(0, smp.RankType.WORLD_RANK)
            assert got[:2] == [1, 2] and torch.equal(got[2], torch.ones(3))
        assert smp.allgather(RANK * 10, smp.WORLD) == [r * 10 for r in range(WS)]
        assert smp.allgather(smp.pp_rank(), smp.MP_GROUP) == [0, 1]
        smp.barrier()
        smp.mp_barrier()
        smp.dp_barrier()
    c.run("send / recv_from / broadcast / allgather / barrier", helpers)

    def outside_step():
        smp.init(cfg)
        model = smp.DistributedModel(M.Chain())
        try:
            model(torch.randn(2, 8))
        except smp.SMPValidationError as e:
            assert "smp.step" in str(e)
        else:
            raise AssertionError("calling the model outside smp.step did not raise")
    c.run("model call outside smp.step is an error", outside_step)

    def eval_and_outputs():
        smp.init(cfg)
        data = M.text_data(2, 4, [7, 11])
        model, opt, ref = train_and_compare("gpt features", M.TinyGPT, {**cfg, "optimize": "speed"}, data,
                                            M.lm_loss, lambda ps: torch.optim.SGD(ps, lr=0.1))
        opt.zero_grad()

        @smp.step
        def eval_step(model, x, y):
            out = model(x)
            loss = M.lm_loss(out, y)
            correct = int((out["logits"].argmax(-1) == y).sum().item())
            return out["logits"], loss.item(), correct, {"t": out["t"]}

        x, y = M.text_data(1, 4, [9], seed=5)[0]
        with torch.no_grad():
            logits, losses, correct, extra = eval_step(model, x, y)
            want = ref(x)["logits"]
        assert isinstance(logits, smp.StepOutput) and len(logits.outputs) == 2
        close(logits.concat(), want, "eval logits (concat)")
        close(logits.stack().reshape(want.shape), want, "eval logits (stack)")
        assert all(isinstance(v, float) for v in losses), losses
        close(sum(losses) / 2, torch.stack([M.lm_loss({"logits": want[i * 2:(i + 1) * 2]}, y[i * 2:(i + 1) * 2])
                                            for i in range(2)]).mean(), "eval losses (floats)")
        assert sum(correct) == int((want.argmax(-1) == y).sum()), (list(correct), want.argmax(-1))
        assert list(extra["t"]) == [9, 9]
        assert all(p.grad is None for p in model.parameters()), "an evaluation step produced gradients"
    c.run("eval under no_grad, non-tensor step outputs", eval_and_outputs)

    def scaler_and_clip():
        cfg2 = {**cfg, "optimize": "speed"}
        train_and_compare("scaler+clip", lambda: M.Chain(depth=4), cfg2, M.chain_data(5, 8 * (WS // 2)),
                          F.cross_entropy, lambda ps: torch.optim.SGD(ps, lr=0.1), scaler=2.0 ** 124, clip=0.5)
    c.run("amp.GradScaler agrees on inf/nan, clip_grad_norm_ sees every partition", scaler_and_clip)

    def checkpoints():
        smp.init(cfg)
        d = os.environ["TEST_CKPT_DIR"]
        data = M.text_data(2, 4 * (WS // 2), [6])
        model, opt, ref = train_and_compare("gpt ckpt", M.TinyGPT, {**cfg, "optimize": "speed"}, data,
                                            M.lm_loss, lambda ps: torch.optim.Adam(ps, lr=1e-2, eps=1e-3))
        smp.save_checkpoint(d, "full", partial=False, model=model, optimizer=opt, user_content={"k": 1})
        smp.save_checkpoint(d, "part", partial=True, model=model, optimizer=opt, user_content={"k": 2})
        if RANK == 0:
            plain = M.TinyGPT()
            plain.load_state_dict(torch.load(os.path.join(d, "full")))   # plain torch.load, weights only
            same_state(plain.state_dict(), ref.state_dict(), "full checkpoint in the plain module")
            assert open(os.path.join(d, "newest")).read() == "part"
            assert not [n for n in os.listdir(d) if ".tmp" in n], os.listdir(d)
        full_opt = opt.state_dict()
        ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
        assert set(full_opt["state"]) == set(range(len(list(ref.parameters())))), sorted(full_opt["state"])
        assert len(full_opt["param_groups"][0]["params"]) == len(ref_opt.param_groups[0]["params"])
        # disturb, then resume both kinds
        with torch.no_grad():
            for p in model.local_parameters():
                p.add_(1.0)
        uc = smp.resume_from_checkpoint(d, partial=True)
        assert uc == {"k": 2}, uc
        same_state(model.state_dict(), ref.state_dict(), "after resume (partial)")
        with torch.no_grad():
            for p in model.local_parameters():
                p.mul_(0.5)
        uc = smp.resume_from_checkpoint(d, tag="full", partial=False)
        assert uc == {"k": 1}, uc
        same_state(model.state_dict(), ref.state_dict(), "after resume (full)")
        # smp.save / smp.load, partial
        f = os.path.join(d, "ckpt.pt")
        smp.save({"model": model.local_state_dict(), "opt": opt.local_state_dict()}, f, partial=True)
        smp.barrier()
        assert sorted(n for n in os.listdir(d) if n.startswith("ckpt.pt")) == ["ckpt.pt_0", "ckpt.pt_1"]
        loaded = smp.load(f, partial=True)
        assert loaded["model"]["_smp_is_partial"] is True
        with torch.no_grad():
            for p in model.local_parameters():
                p.zero_()
        model.load_state_dict(loaded["model"])
        opt.load_state_dict(loaded["opt"])
        same_state(model.state_dict(), ref.state_dict(), "after smp.load (partial)")
        smp.barrier()
    c.run("checkpoints: full into the plain module, partial, smp.save/load", checkpoints)


# ----------------------------------------------------------------- resume with another partitioning

@suite("resume")
def resume(c):
    """Trains 2 steps on 4 partitions, saves, resumes on 2 partitions x 2 replicas."""
    d = os.environ["TEST_CKPT_DIR"]
    data = M.chain_data(4, 8)
    make_opt = lambda ps: torch.optim.Adam(ps, lr=1e-2)  # noqa: E731

    torch.manual_seed(0)
    ref = M.Chain(depth=4)
    ref_losses = M.train_plain(ref, data, make_opt)
    train_step = M.cross_entropy_step(smp)

    def phase(cfg, steps, seed, resume_from=None):
        smp.init(cfg)
        torch.manual_seed(seed)
        net = M.Chain(depth=4)
        model = smp.DistributedModel(net)
        opt = smp.DistributedOptimizer(make_opt(net.parameters()))
        uc = smp.resume_from_checkpoint(d) if resume_from else None
        losses = []
        dp, r = smp.dp_size(), smp.dp_rank()
        for x, y in steps:
            b = x.size(0) // dp
            opt.zero_grad()
            lm = train_step(model, x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]).reduce_mean()
            opt.step()
            losses.append(dp_mean(lm))
        return model, opt, uc, losses

    def run():
        model, opt, _, l1 = phase({"partitions": 4, "microbatches": 2}, data[:2], 0)
        smp.save_checkpoint(d, "step2", partial=True, model=model, optimizer=opt, user_content={"step": 2})
        model, opt, uc, l2 = phase({"partitions": 2, "microbatches": 2, "ddp": True,
                                    "placement_strategy": "spread"}, data[2:], 123, resume_from=True)
        assert uc == {"step": 2}, uc
        close(l1 + l2, ref_losses, "losses across the resume")
        same_state(model.state_dict(), ref.state_dict(), "parameters after resuming on 2 partitions")
    c.run("partial checkpoint from 4 partitions resumed on 2 x 2", run)


# ----------------------------------------------------------------- failures

class Bomb(nn.Module):
    """Identity; raises in forward (or in backward) when armed on the chosen rank."""
    armed = {"forward": False, "backward": False}

    def __init__(self, dp_rank):
        super().__init__()
        self.dp_rank = dp_rank

    def forward(self, x):
        if Bomb.armed["forward"] and smp.dp_rank() == self.dp_rank:
            raise ValueError("boom in forward")
        return _BackwardBomb.apply(x, self.dp_rank)


class _BackwardBomb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dp_rank):
        ctx.dp_rank = dp_rank
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if Bomb.armed["backward"] and smp.dp_rank() == ctx.dp_rank:
            raise ValueError("boom in backward")
        return g, None


class BombNet(nn.Module):
    def __init__(self, bomb_partition, dp_rank):
        super().__init__()
        with smp.partition(0):
            self.a = nn.Linear(8, 8)
        with smp.partition(bomb_partition):
            self.bomb = Bomb(dp_rank)
        with smp.partition(1):
            self.b = nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.bomb(torch.relu(self.a(x))))


@suite("failure")
def failure(c):
    """A stage raises: every rank must end with that error quickly (no hang)."""
    dp = WS // 2
    data = M.chain_data(3, 4 * dp)

    def attempt(kind, partition, victim_dp):
        smp.init({"partitions": 2, "microbatches": 2, "ddp": dp > 1, "auto_partition": False})
        model = smp.DistributedModel(BombNet(partition, victim_dp))
        opt = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))

        @smp.step
        def train_step(model, x, y):
            loss = F.cross_entropy(model(x), y)
            model.backward(loss)
            return loss
        r = smp.dp_rank()
        Bomb.armed[kind] = False
        x, y = data[0]
        train_step(model, x[r * 4:(r + 1) * 4], y[r * 4:(r + 1) * 4])
        opt.step()
        # No rank arms (and fails its next step) while another is still in
        # this one: that rank would meet the failure here, not where checked.
        smp.barrier()
        Bomb.armed[kind] = True
        t0 = time.perf_counter()
        err, failed_at = None, None
        for k in (1, 2):   # a rank whose part of step 1 was done before the failure fails in step 2
            try:
                x, y = data[k]
                train_step(model, x[r * 4:(r + 1) * 4], y[r * 4:(r + 1) * 4])
                opt.step()
            except Exception as e:  # noqa: BLE001
                err, failed_at = e, k
                break
        elapsed = time.perf_counter() - t0
        Bomb.armed[kind] = False
        me_victim = smp.pp_rank() == partition and smp.dp_rank() == victim_dp
        assert err is not None, "no step failed"
        if me_victim:
            assert failed_at == 1 and isinstance(err, ValueError) and f"boom in {kind}" in str(err), repr(err)
        else:
            assert isinstance(err, smp.SMPRemoteError), repr(err)
            text = str(err)
            assert f"ValueError: boom in {kind}" in text, text
            assert f"pp_rank {partition}, dp_rank {victim_dp}" in text, text
        assert elapsed < 30, f"took {elapsed:.1f} s to fail (the operation timeout is 60 s)"
        try:
            train_step(model, *data[2])
        except smp.SMPError as e:
            assert f"boom in {kind}" in str(e), str(e)
        else:
            raise AssertionError("a step after the failure did not raise")

    c.run("forward raises on partition 1", attempt, "forward", 1, dp - 1)
    c.run("backward raises on partition 0", attempt, "backward", 0, 0)


def main():
    c = Checks()
    for item in sys.argv[1:]:
        name, _, arg = item.partition(":")
        c.prefix = item + ": "
        SUITES[name](c, *([arg] if arg else []))
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
