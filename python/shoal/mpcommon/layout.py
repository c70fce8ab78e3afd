"""Where checkpoints live on disk: every file name the two front ends write and read.

PyTorch (``smp.save`` / ``smp.save_checkpoint``)::

    f"{f}_{pp_rank}"                         smp.save(obj, f, partial=True)
    f"{f}_{pp_rank}_{tp_rank}"               (the same, with tensor parallelism)
    path/{tag}_partial/model_pp{r}.pt       each partition's local_state_dict
    path/{tag}_partial/optimizer_pp{r}.pt   each partition's optimizer state
        (with tensor parallelism: ..._pp{r}_tp{t}.pt, one per piece; with
        sharded optimizer state: optimizer_pp{r}_tp{t}_rdp{d}.pt, one per rank)
    path/{tag}_partial/user_content.pt
    path/{tag}_partial/meta.json            written last: marks it complete
    path/{tag}                              (partial=False) the whole model
    path/optimizer_{tag}, path/user_content_{tag}   (partial=False)
    path/newest                             the newest complete tag

TensorFlow (``smp.CheckpointManager``): ``directory/mp_rank_{pp_rank}/``.

Text files are written to a temporary name, flushed and renamed, so a crash
never leaves one half-written.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

META = "meta.json"
NEWEST = "newest"
USER_CONTENT = "user_content.pt"


def save_file(f: str, pp_rank: int, partial: bool, tp_rank: Optional[int] = None) -> str:
    if not partial:
        return f
    return f"{f}_{pp_rank}" if tp_rank is None else f"{f}_{pp_rank}_{tp_rank}"


def partial_dir(path: str, tag: str) -> str:
    return os.path.join(path, f"{tag}_partial")


def part_file(d: str, kind: str, pp_rank: int, tp_rank: Optional[int] = None,
              rdp_rank: Optional[int] = None) -> str:
    """A partial checkpoint's file of one partition (of one tensor-parallel piece of it, of one
    rank's optimizer shard): `kind` is "model" or "optimizer"."""
    name = f"{kind}_pp{pp_rank}"
    if tp_rank is not None:
        name += f"_tp{tp_rank}"
    if rdp_rank is not None:
        name += f"_rdp{rdp_rank}"
    return os.path.join(d, name + ".pt")


def full_file(path: str, kind: str, tag: str) -> str:
    """A full checkpoint's file: `kind` is "model", "optimizer" or "user_content"."""
    return os.path.join(path, tag if kind == "model" else f"{kind}_{tag}")


def partition_dir(directory: str, pp_rank: int) -> str:
    """TensorFlow: the folder of one partition's tf.train checkpoints."""
    return os.path.join(directory, f"mp_rank_{pp_rank}")


def atomic_text(text: str, path: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_meta(path: str, tag: str, meta: dict) -> None:
    atomic_text(json.dumps(meta), os.path.join(partial_dir(path, tag), META))


def read_meta(path: str, tag: str, who: str) -> dict:
    d = partial_dir(path, tag)
    meta_path = os.path.join(d, META)
    if not os.path.exists(meta_path):
        raise FileNotFoundError(f"{who}: {d} is not a complete partial checkpoint ({meta_path} is missing)")
    with open(meta_path) as f:
        return json.load(f)


def write_newest(path: str, tag: str) -> None:
    atomic_text(tag, os.path.join(path, NEWEST))


def newest_tag(path: str, who: str, tag: Optional[str] = None) -> str:
    """`tag`, or the newest complete one in `path`."""
    if tag is not None:
        return str(tag)
    newest = os.path.join(path, NEWEST)
    if not os.path.exists(newest):
        raise FileNotFoundError(f"{who}: no checkpoint in {path} ({newest} is missing)")
    with open(newest) as f:
        return f.read().strip()


def prune(path: str, keep: int) -> None:
    """Keeps the `keep` newest complete partial checkpoints in `path`."""
    dirs = [os.path.join(path, n) for n in os.listdir(path) if n.endswith("_partial")
            and os.path.exists(os.path.join(path, n, META))]
    dirs.sort(key=lambda d: os.path.getmtime(os.path.join(d, META)))
    for d in dirs[:-keep]:
        shutil.rmtree(d, ignore_errors=True)
