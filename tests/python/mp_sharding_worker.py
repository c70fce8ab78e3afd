"""One rank of a job checking gradient reduction under tensor parallelism, optimizer-state sharding
and sharded data parallelism (test_mp_sharding.py). Usage: mp_sharding_worker.py SUITE.

Each check trains the same tiny model twice, with and without the feature, on the same per-rank
batches, and compares losses and parameters; the rule checks set known gradients per rank and
compare the reduced ones with the rule computed by hand.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist

import mp_models as M
import shoal.modelparallel as smp
from harness import Checks
from shoal.modelparallel import sharded_dp
from shoal.modelparallel.grads import GradReducer
from shoal.modelparallel.state import STATE

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])


def close(got, want, what, rtol=1e-5, atol=1e-6):
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.allclose(got, want, rtol=rtol, atol=atol), \
        f"{what}: max difference {(got - want).abs().max().item():.3g}"


def batches(n, batch=4, seed=5, dp_rank=RANK):
    """This rank's batches (each data-parallel rank reads its own)."""
    g = torch.Generator().manual_seed(seed + 100 * dp_rank)
    return [(torch.randn(batch, 8, generator=g), torch.randint(0, 4, (batch,), generator=g)) for _ in range(n)]


def adam(params):
    return torch.optim.Adam(params, lr=1e-2, weight_decay=0.01)


def sgd_groups(net):
    """SGD with momentum, two parameter groups with their own lr and weight decay, and a scheduler."""
    decay = [p for n, p in net.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in net.named_parameters() if not n.endswith("weight")]
    return torch.optim.SGD([{"params": decay, "weight_decay": 0.05}, {"params": rest, "lr": 0.05}],
                           lr=0.1, momentum=0.9)


class Run:
    """A model trained under `cfg` (smp.init again: a new job state each time)."""

    def __init__(self, cfg, make_opt, half=None, depth=4, **opt_args):
        smp.init({**cfg, "fp16": True} if half is torch.float16 else cfg)
        torch.manual_seed(0)
        if half is not None:
            with smp.model_creation(dtype=half):
                self.net = M.Chain(depth=depth)
        else:
            self.net = M.Chain(depth=depth)
        self.model = smp.DistributedModel(self.net)
        inner = make_opt(self.net) if make_opt is sgd_groups else make_opt(self.net.parameters())
        self.opt = smp.DistributedOptimizer(inner, **opt_args)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        self.step_fn = M.cross_entropy_step(smp)
        self.losses, self.norms = [], []
        self.dtype = half or torch.float32

    def train(self, data, clip=None):
        for x, y in data:
            self.opt.zero_grad()
            self.losses.append(self.step_fn(self.model, x.to(self.dtype), y).reduce_mean().item())
            if clip:
                self.norms.append(self.opt.clip_master_grads(clip))
            self.opt.step()
            self.sched.step()
        return self

    def params(self):
        return {n: p.detach().float().clone() for n, p in self.net.named_parameters()}


def same_run(a, b, what, **tol):
    close(a.losses, b.losses, f"{what}: losses", **tol)
    pa, pb = a.params(), b.params()
    for n in pa:
        close(pa[n], pb[n], f"{what}: {n}", **tol)


def state_numel(opt) -> int:
    return sum(v.numel() for st in opt.state.values() for v in st.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)


# ----------------------------------------------------------------------------- optimizer-state sharding
def zero1(c):
    """pp 1 x dp 2: shard_optimizer_state against the unsharded optimizer."""
    base = {"partitions": 1, "ddp": True}
    shard = {**base, "shard_optimizer_state": True}
    data = batches(6)

    def parity(make_opt):
        plain = Run(base, make_opt).train(data)
        n_plain = state_numel(plain.opt)
        sharded = Run(shard, make_opt).train(data)
        same_run(sharded, plain, f"{make_opt.__name__}")
        st = sharded.opt._smp_shard
        mine = st.state_numel()
        assert state_numel(sharded.opt) == 0, "the outer optimizer kept state"
        total = torch.tensor([mine])
        dist.all_reduce(total, group=STATE.grad)
        assert int(total) == n_plain, f"state elements over the ranks {int(total)} != unsharded {n_plain}"
        assert mine <= n_plain // 2 + 8, f"rank holds {mine} of {n_plain} state elements"
    c.run("Adam: losses, parameters, state ~1/dp per rank", parity, adam)
    c.run("SGD momentum, two groups, StepLR: same, state ~1/dp", parity, sgd_groups)

    def clipped():
        plain = Run(base, adam).train(data, clip=0.3)
        sharded = Run(shard, adam).train(data, clip=0.3)
        close(sharded.norms, plain.norms, "clip_master_grads: the global norm")
        assert max(plain.norms) > 0.3, plain.norms       # the clipping did act
        same_run(sharded, plain, "clipped")
    c.run("clip_master_grads: same global norm and training", clipped)

    def fp16():
        plain = Run(base, adam, half=torch.float16, static_loss_scale=128.0).train(data, clip=1.0)
        sharded = Run(shard, adam, half=torch.float16, static_loss_scale=128.0).train(data, clip=1.0)
        # the same fp16 gradient sums, reduce-scattered instead of all-reduced; fp32 masters both ways
        same_run(sharded, plain, "fp16", rtol=2e-3, atol=2e-3)
        masters = sharded.opt._smp_shard.pieces
        assert masters and all(pc.master.dtype == torch.float32 for pc in masters)
    c.run("fp16: fp32 master slices, within 2e-3 of the unsharded", fp16)

    def save_load():
        whole = Run(shard, adam).train(data)
        first = Run(shard, adam).train(data[:3])
        model_sd = {k: v.clone() for k, v in first.model.state_dict().items()}
        gathered = first.opt.local_state_dict(gather_if_shard=True)      # a collective of the RDP group
        own = first.opt.local_state_dict(gather_if_shard=False)
        assert ("_smp_shards" in gathered) == (smp.rdp_rank() == 0)
        if smp.rdp_rank() == 0:
            assert len(gathered["_smp_shards"]) == smp.rdp_size()
        try:
            first.opt.state_dict()
        except smp.SMPValidationError as e:
            assert "not supported with shard_optimizer_state" in str(e) and "partial" in str(e), str(e)
        else:
            raise AssertionError("the full state_dict was saved with sharding")
        sched_sd = first.sched.state_dict()
        # rdp rank 0's gathered file serves every rank (each picks its shard) ...
        path = os.path.join(tempfile.gettempdir(), f"shoal-zero1-{os.environ['MASTER_PORT']}.pt")
        if RANK == 0:
            torch.save(gathered, path)
        dist.barrier()
        from_file = torch.load(path, weights_only=False)
        dist.barrier()
        for label, sd in (("gathered", from_file), ("own shard", own)):
            again = Run(shard, adam)
            again.model.load_state_dict(model_sd, strict=False)
            again.opt.load_state_dict(sd)         # before partitioning: applied when the shards exist
            again.sched.load_state_dict(sched_sd)
            again.losses = list(first.losses)
            again.train(data[3:])
            same_run(again, whole, f"resumed from the {label}")
        if RANK == 0:
            os.unlink(path)
    c.run("local_state_dict round trip, then identical training", save_load)

    def mutated_layout():
        a = Run(shard, adam).train(data[:1])
        sd = a.opt.local_state_dict(gather_if_shard=False)
        sd["_smp_shard"]["layout"] = sd["_smp_shard"]["layout"][:-1]
        try:
            a.opt.load_state_dict(sd)
        except smp.SMPValidationError as e:
            assert "another layout" in str(e), str(e)
        else:
            raise AssertionError("a shard of another layout was loaded")
    c.run("a shard of another layout is refused", mutated_layout)


def zero1_pipeline(c):
    """pp 2 x dp 2 (world 4): sharding inside each partition's DP group, clip norm over the world."""
    data = batches(5, dp_rank=RANK // 2)       # ranks 2d and 2d+1 form replica d (placement "cluster")
    base = {"partitions": 2, "microbatches": 2, "ddp": True}

    def run():
        plain = Run(base, adam).train(data, clip=0.3)
        sharded = Run({**base, "shard_optimizer_state": True}, adam).train(data, clip=0.3)
        close(sharded.norms, plain.norms, "clip norm")
        same_run(sharded, plain, "pp2 x dp2")
    c.run("pp 2 x dp 2: same losses, parameters and clip norms", run)


# ----------------------------------------------------------------------------- the rule with tensor parallelism
class Marked(torch.nn.Module):
    """Two parameters split by hand over the tensor-parallel ranks, two replicated ones."""

    def __init__(self):
        super().__init__()
        self.rep = torch.nn.Parameter(torch.zeros(6))
        self.col = torch.nn.Parameter(torch.zeros(5, 3))
        self.row = torch.nn.Parameter(torch.zeros(7))
        self.rep2 = torch.nn.Parameter(torch.zeros(4))
        for p in (self.col, self.row):
            p._smp_distributed, p._smp_split_dim = True, 0


def tp_rule(c):
    """tp 2 x rdp 2 (world 4): each rank's gradient is (rank + 1) * (index + 1); the reducer must give
    the DP mean for replicated parameters and the RDP sum over the DP size (or the RDP size with
    prescaled batches) for distributed ones."""
    def check(prescaled, sharded, cap):
        smp.init({"partitions": 1, "ddp": True, "tensor_parallel_degree": 2, "prescaled_batch": prescaled,
                  "shard_optimizer_state": sharded})
        s = STATE
        assert s.tp_size == 2 and s.rdp_size == 2 and s.dp_size == 4
        m = Marked()
        params = list(m.parameters())
        red = GradReducer(params, s.grad, cap)
        grads = {}
        for k in range(2):                       # twice: the second step reuses the layout
            red.begin_step("whole", [])
            for p in params:
                p.grad = (torch.arange(p.numel(), dtype=torch.float32).view_as(p) + 1) * (RANK + 1 + k)
            for p in params:
                grads[p] = p.grad.clone()
            red.finish()
        want = {}
        for p in params:
            per_rank = torch.stack([(torch.arange(p.numel(), dtype=torch.float32).view_as(p) + 1) * (r + 2)
                                    for r in range(WS)])
            if getattr(p, "_smp_distributed", False):
                total = per_rank[s.rdp_ranks].sum(0)
                want[p] = total / (s.rdp_size if prescaled else s.dp_size)
            else:
                want[p] = per_rank[s.dp_ranks].sum(0) / s.dp_size
        if not sharded:
            for n, p in m.named_parameters():
                close(p.grad, want[p], f"{n} (prescaled {prescaled}, cap {cap})")
            return
        for b in red.buckets:                   # each rank holds its slice of each bucket
            full = torch.cat([want[p].reshape(-1) for p in b.params])
            full = torch.cat([full, full.new_zeros(b.flat.numel() - full.numel())])
            chunk = b.shard.numel()
            close(b.shard, full[b.route.rank * chunk:(b.route.rank + 1) * chunk], "the owned slice")
            assert b.route.group is (s.rdp_grad if getattr(b.params[0], "_smp_distributed", False) else s.grad)
        red.close()
    for prescaled in (False, True):
        c.run(f"all-reduce rule, prescaled_batch {prescaled}", check, prescaled, False, 1 << 20)
    c.run("all-reduce rule, one parameter per bucket", check, False, False, 8)
    c.run("reduce-scatter rule (shard_optimizer_state)", check, False, True, 1 << 20)

    def train_marked(shard):
        """Chain with its block weights marked distributed: sharded and unsharded runs agree."""
        mark = mark_blocks
        cfg = {"partitions": 1, "ddp": True, "tensor_parallel_degree": 2}
        data = batches(5)
        plain = mark(Run(cfg, adam)).train(data, clip=0.3)
        sharded = mark(Run({**cfg, "shard_optimizer_state": True}, adam)).train(data, clip=0.3)
        close(sharded.norms, plain.norms, "clip norm")
        same_run(sharded, plain, "tp 2 x rdp 2 with marked parameters")
    c.run("tp 2 x rdp 2: sharded optimizer equals unsharded (marked params)", train_marked, True)


# ----------------------------------------------------------------------------- sharded data parallelism
def sdp(c):
    """pp 1 x dp 2: sharded_data_parallel_degree 2 against plain data parallelism."""
    data = batches(6)

    def parity(clip_cfg):
        base = {"partitions": 1, "ddp": True}
        plain = Run(base, adam)
        plain_norms = []
        for x, y in data:                            # plain DP, clipped by hand as sdp clips by itself
            plain.opt.zero_grad()
            plain.losses.append(plain.step_fn(plain.model, x, y).reduce_mean().item())
            plain_norms.append(plain.opt.clip_master_grads(clip_cfg))
            plain.opt.step()
            plain.sched.step()
        full = sum(p.numel() for p in plain.net.parameters())
        cfg = {**base, "sharded_data_parallel_degree": 2, "sdp_param_persistence_threshold": 16,
               "sdp_gradient_clipping": clip_cfg}
        sh = Run(cfg, adam).train(data)
        close(sh.losses, plain.losses, "losses")
        assert max(plain_norms) > clip_cfg, plain_norms   # the clipping did act
        params = list(sh.net.parameters())
        sharded = [p for p in params if hasattr(p, "placements")]
        assert sharded, "no parameter was sharded"
        assert all(p.numel() < 16 for p in params if not hasattr(p, "placements")), "a large one stayed whole"
        stored = sharded_dp.sharded_numel(params)
        small = sum(p.numel() for p in params if not hasattr(p, "placements"))
        assert stored <= (full - small) // 2 + small + 16, f"stores {stored} of {full}"
        pl = plain.params()
        for n, p in sh.net.named_parameters():
            whole = p.full_tensor() if hasattr(p, "full_tensor") else p
            close(whole.detach(), pl[n], f"{n}")
    c.run("sdp 2: losses and parameters equal plain DP; ~1/2 stored", parity, 0.3)

    def refused(cfg, words):
        try:
            smp.init(cfg)
        except smp.SMPConfigError as e:
            assert all(w in str(e) for w in words), str(e)
        else:
            raise AssertionError(f"{cfg} was accepted")
    c.run("sdp with pipeline parallelism is refused", refused,
          {"partitions": 2, "sharded_data_parallel_degree": 2, "ddp": True},
          ["sharded_data_parallel_degree", "pipeline"])
    c.run("sdp not dividing the rdp degree is refused", refused,
          {"partitions": 1, "ddp": True, "sharded_data_parallel_degree": 3}, ["3", "divide"])


def mark_blocks(run):
    """Chain's block weights marked as tensor-parallel pieces (split by hand, see the module docstring)."""
    for n, p in run.net.named_parameters():
        if n.startswith("blocks.") and n.endswith("weight"):
            p._smp_distributed, p._smp_split_dim = True, 0
    return run


def sdp_world4(c):
    """World 4: sdp 2 inside rdp 4 (HSDP, a (replicate, shard) mesh) against plain DP 4; and tp 2 x
    sdp 2 with marked parameters against tp 2 with the reducer (FSDP's RDP average completed)."""
    data = batches(4)
    extra = {"sdp_param_persistence_threshold": 16, "sdp_gradient_clipping": 0.3}

    def against(cfg, mark):
        plain = Run(cfg, adam)
        if mark:
            mark_blocks(plain)
        for x, y in data:
            plain.opt.zero_grad()
            plain.losses.append(plain.step_fn(plain.model, x, y).reduce_mean().item())
            plain.opt.clip_master_grads(0.3)
            plain.opt.step()
            plain.sched.step()
        sh = Run({**cfg, "sharded_data_parallel_degree": 2, **extra}, adam)
        if mark:
            mark_blocks(sh)
        sh.train(data)
        close(sh.losses, plain.losses, "losses")
        pl = plain.params()
        for n, p in sh.net.named_parameters():
            whole = p.full_tensor() if hasattr(p, "full_tensor") else p
            close(whole.detach(), pl[n], n)
        return sh
    def hsdp():
        sh = against({"partitions": 1, "ddp": True}, False)
        p = next(p for p in sh.net.parameters() if hasattr(p, "placements"))
        assert p.device_mesh.mesh_dim_names == ("replicate", "shard"), p.device_mesh
    c.run("sdp 2 in rdp 4 (HSDP) equals plain DP", hsdp)
    c.run("tp 2 x sdp 2 equals tp 2 (marked params)", against,
          {"partitions": 1, "ddp": True, "tensor_parallel_degree": 2}, True)


SUITES = {"zero1": zero1, "zero1_pipeline": zero1_pipeline, "tp_rule": tp_rule, "sdp": sdp, "sdp_world4": sdp_world4}


def main():
    c = Checks()
    SUITES[sys.argv[1]](c)
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
