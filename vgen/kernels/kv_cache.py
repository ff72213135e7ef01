"""Static KV cache: allocated once for (layers, batch, heads, max_len, head_dim) and written in place.

Cache slot == sequence position. Attention masks are built from positions (a key at slot j is visible
to a query at position p when j <= p, or from an explicit mask), so rolling back to a shorter prefix is
free: slots past the new length are masked until they are overwritten. Positions can be shared by the
batch (``input_pos`` of shape (S,)) or per sample ((B, S)), which is what ragged speculative decoding needs.

Attention reads only the first ``length`` slots (``limit(n)``; all of them by default): a sampler that knows no
query will look past slot n - 1 sets it, so a step costs what the filled prefix costs, not the whole cache (at
512 tokens, attention over the full cache is most of an early step). ``bucket(n)`` rounds a length up to one of
a few values, for compiled steps (each distinct length is one graph).

On CUDA the cache is what CUDA graphs need (gpt-fast keeps it as module buffers for the same reason): every tensor a
step reads or writes in place is marked a static address (``torch._dynamo.mark_static_address``), so a step
compiled ``mode="reduce-overhead"`` replays one recorded graph that updates the cache where it lies, instead of
skipping CUDA graphs for a mutated input; the next cache of the same shape reuses those tensors (their addresses),
so the recorded graphs replay again instead of being recorded anew. ``bucket`` is the whole cache there: one graph
for every length, its unfilled slots masked (attention over a few hundred slots is not what a GPU step waits on;
launches are).
"""
from __future__ import annotations

import weakref

import torch


def static(t: torch.Tensor) -> torch.Tensor:
    """On a static device (:data:`STATIC_DEVICES`), mark ``t`` a static input of compiled graphs (CUDA graphs record
    its address and read and update it in place, never copying it in; ``guard=False``: another tensor there is
    re-recorded, not recompiled). Elsewhere ``t`` is left as it is. Returns ``t``."""
    if t.device.type in STATIC_DEVICES:
        import torch._dynamo
        torch._dynamo.mark_static_address(t, guard=False)
    return t


def static_all(obj, _seen: set | None = None):
    """:func:`static` on every tensor reachable from ``obj`` (through tuples, lists, dicts and plain objects'
    attributes: a draft source's ``step_args``, such as a tree's index tables); a module's parameters and buffers are
    a compiled graph's static inputs already and are not walked. Returns ``obj``."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen or isinstance(obj, (torch.nn.Module, type, str, bytes, int, float)) or obj is None:
        return obj
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        static(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            static_all(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            static_all(v, seen)
    elif hasattr(obj, "__dict__") and not callable(obj):
        for v in vars(obj).values():
            static_all(v, seen)
    return obj


# CUDA caches of the last POOL_SHAPES shapes, for reuse: a sampler call makes a new cache, and a new address would
# make every compiled step record its CUDA graph again (and keep the old recording). A pooled cache's tensors go to
# the next cache of the same shape once their holder is gone (never to two live caches). Keys and values are not
# cleared: every slot a query reads is written first in its own run (the masks say which).
POOL_SHAPES = 4
POOL_PER_KEY = 4  # tensors of one shape pooled at once (live together in one run: a target's and its draft's caches)
STATIC_DEVICES = ("cuda",)  # device types whose caches are static addresses and pooled
_POOL: dict[tuple, list[list]] = {}  # key -> [[weak reference to the holder, tensors], ...]


# A decode loop's own state on a static device (a speculative run's slot state, ZipAR's buffers), pooled the same way
# by name, shape and dtype: the next run's compiled steps replay the graphs recorded with these addresses.
POOL_BUFFERS = 64
_BUFFERS: dict[tuple, list[list]] = {}


def _reuse(key: tuple, owner, pool: dict | None = None) -> tuple | None:
    """Tensors pooled under ``key`` whose holder is gone (the first such, in the order they were pooled), now held by
    ``owner``; None if every one is in use."""
    pool = _POOL if pool is None else pool
    for entry in pool.get(key, ()):
        if entry[0]() is None:
            entry[0] = weakref.ref(owner)
            pool[key] = pool.pop(key)  # most recent last
            return entry[1]
    return None


def _keep(key: tuple, owner, tensors: tuple, pool: dict | None = None, size: int = POOL_SHAPES) -> None:
    """Pool ``tensors`` (held by ``owner``) under ``key``: several per key (a draft model's cache has its target's
    shape), at most :data:`POOL_PER_KEY`; at most ``size`` keys, the least recent dropped."""
    pool = _POOL if pool is None else pool
    entries = pool.pop(key, [])
    if len(entries) < POOL_PER_KEY:
        entries.append([weakref.ref(owner), tensors])
    pool[key] = entries
    while len(pool) > size:
        pool.pop(next(iter(pool)))


def static_buffer(owner, name: str, shape: tuple, dtype: torch.dtype, device, fill=0) -> torch.Tensor:
    """A tensor filled with ``fill`` for the lifetime of ``owner`` (a run: any object a weak reference can point
    to). On a static device it is a static address: the one a finished holder of the same ``name``, shape and dtype
    left, if any (so the next run's compiled steps replay the CUDA graphs recorded with it), else a new one, pooled
    (at most :data:`POOL_BUFFERS`). Elsewhere a new tensor."""
    device = torch.device(device)
    if device.type not in STATIC_DEVICES:
        return torch.full(tuple(shape), fill, dtype=dtype, device=device)
    key = (name, tuple(shape), dtype, device)
    held = _reuse(key, owner, _BUFFERS)
    if held is not None:
        return held[0].fill_(fill)
    t = static(torch.full(tuple(shape), fill, dtype=dtype, device=device))
    _keep(key, owner, (t,), _BUFFERS, POOL_BUFFERS)
    return t


class KVCache:
    def __init__(self, n_layer: int, batch_size: int, n_kv_head: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (batch_size, n_kv_head, max_len, head_dim)
        self.static = torch.device(device).type in STATIC_DEVICES
        key = (type(self), n_layer, shape, dtype, torch.device(device))
        held = _reuse(key, self) if self.static else None
        if held is not None:  # a finished cache's tensors, at the addresses its CUDA graphs were recorded with
            self.k, self.v, self.slots, self.rows, self._mask = held
            self.slots.copy_(torch.arange(max_len, device=device))  # hide() may have changed them
        else:
            # one tensor per layer (not views of one big tensor): compiled steps then update them in place
            self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
            self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
            # key slot index, used to build position-based masks without allocating per step
            self.slots = torch.arange(max_len, device=device)
            self.rows = torch.arange(batch_size, device=device)
            self._mask = None  # mask_keys' tensor on a static cache (filled in place)
            if self.static:
                self._mask = torch.ones((batch_size, max_len), dtype=torch.bool, device=device)
                for t in (*self.k, *self.v, self.slots, self.rows, self._mask):
                    static(t)
                _keep(key, self, (self.k, self.v, self.slots, self.rows, self._mask))
        self.max_len = max_len
        self.batch_size = batch_size
        self.length = max_len  # slots attention reads (limit)
        self.write_slots = None  # write_at: where updates write instead of their positions
        self.key_mask = None  # (batch, max_len) bool, False = a padding key no query reads (mask_keys)

    def hide(self, n: int) -> None:
        """Never let attention read slots [0, n): for a cache whose first n positions nobody writes (a draft
        head's: the condition's positions), which would otherwise be read as zero keys. Position-based masks
        (``causal_mask``, tree masks) compare ``slots`` with positions; these slots compare as past every one."""
        self.slots[:n] = torch.iinfo(self.slots.dtype).max

    def mask_keys(self, valid: torch.Tensor | None) -> None:
        """Hide padding keys per row: ``valid`` (B, n) bool says which of each row's first n slots hold real keys (a
        left-padded caption's mask); None: every slot. Every mask attention builds from this cache is then and-ed
        with it (:meth:`visible`), whatever the positions or tree masks: a padded caption reads as the caption alone."""
        if valid is None:
            self.key_mask = None
            return
        if self._mask is None:
            m = torch.ones((self.batch_size, self.max_len), dtype=torch.bool, device=valid.device)
        else:  # a static cache's own tensor, at its recorded address
            m = self._mask.fill_(True)
        m[: valid.shape[0], : valid.shape[1]] = valid
        self.key_mask = m

    def visible(self, mask: torch.Tensor) -> torch.Tensor:
        """``mask`` (B or 1, 1, S, length) and-ed with the padding keys' mask of :meth:`mask_keys` (unchanged when
        there is none)."""
        if self.key_mask is None:
            return mask
        return mask & self.key_mask[:, None, None, : self.length]

    def limit(self, n: int | None) -> None:
        """Let attention read slots [0, n) only (None: all). Every query position must be < n."""
        self.length = self.max_len if n is None else max(1, min(int(n), self.max_len))

    def write_at(self, slots: torch.Tensor | None) -> None:
        """Let the next updates write at ``slots`` (same shape as their positions) instead of at their positions
        (None: at the positions). Tree passes need it: the nodes of one depth share a position (their RoPE) but each
        has its own scratch slot past the sequence (:mod:`vgen.kernels.tree`)."""
        self.write_slots = slots

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's keys and values from slots ``src`` to slots ``dst`` ((B, M) each, per row of the
        first B rows): a tree pass keeps its accepted path this way."""
        b = self.rows[: src.shape[0], None]
        for kc, vc in zip(self.k, self.v):
            kc[b, :, dst] = kc[b, :, src]
            vc[b, :, dst] = vc[b, :, src]

    def bucket(self, n: int, parts: int = 4) -> int:
        """``n`` rounded up to a multiple of max_len / parts (at least 64 slots): few distinct lengths. On CUDA
        max_len: one graph."""
        if self.static:
            return self.max_len
        step = max(64, -(-self.max_len // parts))
        return min(self.max_len, -(-int(n) // step) * step)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @staticmethod
    def nbytes_for(n_layer: int, batch_size: int, n_kv_head: int, max_len: int, head_dim: int,
                   dtype: torch.dtype = torch.float32) -> int:
        """What a cache of this shape holds, without allocating it."""
        return 2 * n_layer * batch_size * n_kv_head * max_len * head_dim * torch.empty((), dtype=dtype).element_size()

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, H, S, D) at ``input_pos`` ((S,) or (B, S)); return this layer's K, V over the first
        ``length`` slots."""
        kc, vc = self.k[layer], self.v[layer]
        if self.write_slots is not None:
            input_pos = self.write_slots
        if input_pos.dim() == 1:
            kc[:, :, input_pos] = k  # index_put_: reinplaced by inductor, no whole-cache copy
            vc[:, :, input_pos] = v
        else:
            b = self.rows[: k.shape[0], None]  # (B, 1) with input_pos (B, S): index_put_, also reinplaced
            kc[b, :, input_pos] = k.transpose(1, 2)
            vc[b, :, input_pos] = v.transpose(1, 2)
        if self.length < self.max_len:
            return kc[:, :, : self.length], vc[:, :, : self.length]
        return kc, vc

    def causal_mask(self, input_pos: torch.Tensor) -> torch.Tensor:
        """Bool mask, True = attend: (1, 1, S, length) for shared positions, (B, 1, S, length) per sample."""
        m = self.slots[: self.length] <= input_pos[..., None]
        return m[None, None] if input_pos.dim() == 1 else m[:, None]

