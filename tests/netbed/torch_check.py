"""One rank of a torch-level check of the `shoal` backend across the net bed.

Started by test_netbed.py on every rank of the bed (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set by the bed's job runner). Each collective runs on known tensors and
is compared exactly; any mismatch raises (exit 1). Prints one line when all passed.
"""
import datetime
import socket

import torch
import torch.distributed as dist

import shoal.torch  # noqa: F401  (registers the "shoal" backend)


def expect(got, want, what):
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten()[:5].tolist()
        raise AssertionError(f"{what}: {int((got != want).sum())} wrong elements, first at "
                             f"{bad}: got {got.flatten()[bad].tolist()}, want "
                             f"{want.flatten()[bad].tolist()}")


def main():
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    checks = 0

    # all_reduce: an empty tensor, odd sizes, one above the 1 MiB pipelining segment.
    for count in (0, 1, 7, 1001, 262147):
        base = torch.arange(count, dtype=torch.float32)
        t = base + r
        dist.all_reduce(t)
        expect(t, n * base + n * (n - 1) / 2, f"all_reduce sum count {count}")
        checks += 1
    t = torch.tensor([10 * r, -r, 7], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    expect(t, torch.tensor([10 * (n - 1), 0, 7], dtype=torch.int64), "all_reduce max int64")
    checks += 1

    # all_gather (list of tensors) and all_gather_into_tensor.
    for count in (1, 5, 4099):
        base = torch.arange(count, dtype=torch.float32)
        inp = base + 1000 * r
        outs = [torch.full((count,), -1.0) for _ in range(n)]
        dist.all_gather(outs, inp)
        for q, o in enumerate(outs):
            expect(o, base + 1000 * q, f"all_gather count {count} block {q}")
        flat = torch.full((n * count,), -1.0)
        dist.all_gather_into_tensor(flat, inp)
        expect(flat, torch.cat([base + 1000 * q for q in range(n)]),
               f"all_gather_into_tensor count {count}")
        checks += 2

    # broadcast from rank 0 and from the last rank (on the other host).
    for root in (0, n - 1):
        for count in (3, 100003):
            want = torch.arange(count, dtype=torch.float64) * (root + 1)
            t = want.clone() if r == root else torch.zeros(count, dtype=torch.float64)
            dist.broadcast(t, src=root)
            expect(t, want, f"broadcast root {root} count {count}")
            checks += 1

    dist.barrier()
    print(f"torch check ok: rank {r} of {n} on {socket.gethostname()}, {checks} checks",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
