"""One rank of the fused-optimizer job (test_mp_fused.py). Usage: mp_fused_worker.py fused

With 2 ranks and 2 partitions each check trains a model with smp and a
smp.optimizers optimizer (wrapped by smp.DistributedOptimizer), and the same
model with the same optimizer in one process, and compares losses and
parameters (mp_worker.train_and_compare). LAMB's gradient clip is set to engage
on every step and its eps is large enough that the clip factor shows in the
update, so a norm taken over one partition only (no reduction over the
pipeline group) changes the parameters; the optimizer's global gradient norm
after the last step is also compared with the whole model's.
"""

import math
import os
import sys

import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mp_models as M  # noqa: E402
from harness import Checks  # noqa: E402
from mp_worker import close, train_and_compare  # noqa: E402
from shoal.modelparallel import optimizers as O  # noqa: E402

CFG = {"partitions": 2, "microbatches": 2, "pipeline": "interleaved"}
STEPS = 4


def check(name, make_opt, *, lamb=False):
    def run():
        model, opt, ref = train_and_compare(name, lambda: M.Chain(depth=4), CFG, M.chain_data(STEPS, 8),
                                            F.cross_entropy, make_opt)
        local = [p for p in model.local_parameters() if p.grad is not None]
        assert local and len(local) < len(list(ref.parameters())), "the model is not split"
        if lamb:
            want = math.sqrt(sum(float(p.grad.double().square().sum()) for p in ref.parameters()))
            close(float(opt.global_grad_norm()), want, f"{name}: global gradient norm", rtol=1e-5, atol=0)
            assert want > opt.defaults["max_grad_norm"], f"{name}: the clip did not engage ({want})"
    return run


def main():
    c = Checks()
    c.run("lamb L2 mode, global clip", check("lamb l2", lambda ps: O.FusedLamb(
        ps, lr=0.05, eps=1e-3, weight_decay=0.01, adam_w_mode=False, max_grad_norm=0.05), lamb=True))
    c.run("lamb adamw nvlamb, global clip", check("lamb nvlamb", lambda ps: O.FusedLAMB(
        ps, lr=0.05, eps=1e-2, weight_decay=0.0, use_nvlamb=True, max_grad_norm=0.05), lamb=True))
    c.run("novograd", check("novograd", lambda ps: O.FusedNovoGrad(ps, lr=0.05, weight_decay=0.01)))
    c.run("novograd reg inside, inf norm", check("novograd inf", lambda ps: O.FusedNovoGrad(
        ps, lr=0.05, weight_decay=0.01, reg_inside_moment=True, norm_type=0)))
    c.run("adam", check("adam", lambda ps: O.FusedAdam(ps, lr=0.05, weight_decay=0.01)))
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
