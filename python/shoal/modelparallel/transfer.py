"""Moving nested Python structures that hold tensors between ranks.

A value that crosses a stage boundary may be a tensor, a tuple/list/dict of
them, a dataclass, an int from ``x.size(1)``, None: anything picklable. It is
sent as

1. a header of HEADER_BYTES: the length of the metadata and the metadata
   itself when it fits;
2. the rest of the metadata, only when it did not fit;
3. one message per tensor holding data, in order, straight from the tensor's
   memory (a non-contiguous tensor is made contiguous first). Like any
   ``isend``, a sent tensor must not be modified in place until the step ends.

The metadata is the structure pickled with each tensor replaced by its index
(pickle's persistent ids), plus each tensor's shape, dtype and requires_grad,
so the receiver needs to know nothing in advance: variable sequence lengths
and changing structures just work. The receiver allocates each tensor (on the device it names: a pipeline stage
receives onto its partition's device) and receives into it; the ones that required grad on the sender are leaves that
require grad on the receiver, so that the receiver can send their gradients
back.

Tags: a transfer with tag t uses tags 4t (header), 4t+1 (metadata overflow)
and 4t+2 (tensors) of the group, matched first-in first-out per sender and tag.
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist

HEADER_BYTES = 512
_PREFIX = 16


class _Pickler(pickle.Pickler):
    def __init__(self, f, tensors: List[torch.Tensor]):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            if obj.is_sparse or obj.layout != torch.strided:
                raise TypeError(f"smp: cannot send a {obj.layout} tensor between pipeline stages")
            self.tensors.append(obj)
            return len(self.tensors) - 1
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, tensors: List[torch.Tensor]):
        super().__init__(f)
        self.tensors = tensors

    def persistent_load(self, pid):
        return self.tensors[pid]


def _dumps(obj: Any) -> Tuple[bytes, List[torch.Tensor]]:
    f = io.BytesIO()
    tensors: List[torch.Tensor] = []
    try:
        _Pickler(f, tensors).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise TypeError(f"smp: a value crossing a pipeline stage boundary cannot be sent: {e} "
                        f"(values must be tensors or picklable Python objects)") from e
    return f.getvalue(), tensors


def _loads(payload: bytes, tensors: List[torch.Tensor]) -> Any:
    return _Unpickler(io.BytesIO(payload), tensors).load()


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"smp: unknown dtype {name!r} in a transfer header")
    return dt


def tensors_of(obj: Any) -> List[torch.Tensor]:
    """The tensors inside `obj`, in the order a transfer numbers them."""
    return _dumps(obj)[1]


def detached(obj: Any) -> Tuple[Any, List[torch.Tensor], List[torch.Tensor]]:
    """What a transfer of `obj` to this same rank would deliver, without copying
    tensor data: a rebuilt structure whose tensors are detached leaves
    (requiring grad where the originals did). Returns it, its tensors, and the
    original tensors in the same order."""
    payload, tensors = _dumps(obj)
    leaves = [t.detach().requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex()
              else t.detach() for t in tensors]
    return _loads(payload, leaves), leaves, tensors


def pack(obj: Any) -> Tuple[torch.Tensor, Optional[torch.Tensor], List[torch.Tensor], List[torch.Tensor]]:
    """(header, metadata overflow or None, the data messages, the tensors in order)."""
    payload, tensors = _dumps(obj)
    descs, data = [], []
    for t in tensors:
        descs.append((tuple(t.shape), str(t.dtype), bool(t.requires_grad)))
        if t.numel():
            data.append(t.detach().contiguous())
    meta = pickle.dumps((payload, descs), protocol=pickle.HIGHEST_PROTOCOL)
    header = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
    hb = header.numpy()
    hb[:_PREFIX] = memoryview(struct.pack("<QQ", len(meta), len(data))).cast("B")
    first = min(len(meta), HEADER_BYTES - _PREFIX)
    hb[_PREFIX:_PREFIX + first] = memoryview(meta[:first]).cast("B")
    extra = None
    if len(meta) > first:
        extra = torch.frombuffer(bytearray(meta[first:]), dtype=torch.uint8)
    return header, extra, data, tensors


def _allocate(meta: bytes, device: torch.device) -> Tuple[bytes, List[torch.Tensor], List[bool]]:
    payload, descs = pickle.loads(meta)
    tensors = [torch.empty(shape, dtype=_dtype(dtname), device=device) for shape, dtname, _ in descs]
    return payload, tensors, [rg for _, _, rg in descs]


def _finish(payload: bytes, tensors: List[torch.Tensor], grads: List[bool]) -> Tuple[Any, List[torch.Tensor]]:
    for t, rg in zip(tensors, grads):
        if rg:
            t.requires_grad_(True)
    return _loads(payload, tensors), tensors


def isend(obj: Any, dst: int, tag: int, group) -> Tuple[list, List[torch.Tensor]]:
    """Starts sending `obj` to global rank `dst`; returns (works, the tensors sent)."""
    header, extra, data, tensors = pack(obj)
    works = [dist.isend(header, dst, group=group, tag=4 * tag)]
    if extra is not None:
        works.append(dist.isend(extra, dst, group=group, tag=4 * tag + 1))
    for t in data:
        works.append(dist.isend(t, dst, group=group, tag=4 * tag + 2))
    return works, tensors


class Incoming:
    """A posted receive of one transfer from global rank `src`.

    Posted ahead of time, it completes in the background: ``advance()`` (never
    blocks) posts the tensors' receives as soon as the header has arrived, and
    ``wait()`` finishes it and returns the value and its tensors."""

    def __init__(self, src: int, tag: int, group, device: Optional[torch.device] = None):
        self.src, self.tag, self.group = src, tag, group
        self.device = torch.device("cpu") if device is None else device
        self.header = torch.empty(HEADER_BYTES, dtype=torch.uint8)
        self.work = dist.irecv(self.header, src, group=group, tag=4 * tag)
        self.parsed: Optional[tuple] = None

    def advance(self) -> None:
        if self.parsed is None and self.work.is_completed():
            self._post_data()

    def _post_data(self) -> None:
        self.work.wait()   # done already, or raises its error
        hb = self.header.numpy()
        meta_len, _ = struct.unpack("<QQ", hb[:_PREFIX].tobytes())
        first = min(meta_len, HEADER_BYTES - _PREFIX)
        meta = hb[_PREFIX:_PREFIX + first].tobytes()
        if meta_len > first:
            extra = torch.empty(meta_len - first, dtype=torch.uint8)
            dist.irecv(extra, self.src, group=self.group, tag=4 * self.tag + 1).wait()
            meta += extra.numpy().tobytes()
        payload, tensors, grads = _allocate(meta, self.device)
        works = [dist.irecv(t, self.src, group=self.group, tag=4 * self.tag + 2) for t in tensors if t.numel()]
        self.parsed = (payload, tensors, grads, works)

    def wait(self) -> Tuple[Any, List[torch.Tensor]]:
        if self.parsed is None:
            self._post_data()
        payload, tensors, grads, works = self.parsed
        for w in works:
            w.wait()
        return _finish(payload, tensors, grads)


def recv(src: int, tag: int, group, device: Optional[torch.device] = None) -> Tuple[Any, List[torch.Tensor]]:
    return Incoming(src, tag, group, device).wait()
