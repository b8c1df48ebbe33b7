"""The selectors' trees, on whichever ops their shard's tier selects with.

:func:`gear_flow.backend.selection_ops` picks the operations (numba twins on the
host tiers, CUDA kernels on ``device``); the classes here hold one tree and
move data to and from it, so that a selector never needs to know where its tree
lives.  Arguments and results are host NumPy arrays either way.

On the device the trees are CuPy arrays and every call moves as little as it
can, explicitly (``cupy.asarray`` up, ``.get()`` down, nothing implicit):

* an update of ``n`` leaves packs ``(slots, values)`` into one host buffer,
  uploads it once and launches the update kernel; no host synchronisation;
* a draw uploads its uniforms, runs ``tree_sample`` (which scales them by the
  root on the device) and copies the ``n`` drawn slots back;
* every change queues an 8-byte copy of the new root into pinned host memory
  right behind it, so ``mass`` waits for a copy already in flight (done long
  before, when a learner works between its update and its next sample) instead
  of starting a round trip;
* top-k copies back the winners, indices and values in one buffer.

Ordering.  Device operations run on CuPy's current stream: a sample's on the
learner's stream (the table samples inside ``SampleBuffers.gather_stream``),
an update's on the caller's.  Those may differ and need not synchronise with
each other (PyTorch's streams are non-blocking), so each device tree keeps a
fence, as the GPU storage tiers do: the event recorded after its last
operation, which the next operation's stream waits for.  Every call that
returns host values ends with a copy back that waits for its own stream.

Host logic also needs single leaves (a drawn item's probability, the
tail-mass deltas of strict windows, heap ties): for that a device tree keeps a
host mirror of its leaves, written with the very values uploaded, so it equals
the device leaves bit for bit and is never copied back.  On the host tiers
``leaves`` is a view of the tree's leaf level, not a copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ..backend import SelectionOps
from ..ops import maxtree as host_maxtree


class _Tree:
    def __init__(self, ops: SelectionOps, module, capacity: int):
        self.ops = module
        self.on_device = ops.on_device
        self.capacity = int(capacity)
        self._scratch = None
        self._fence = None  # device: the event after the last operation on this tree
        if self.on_device:
            import cupy

            self._cp = cupy
            self.device_id = int(cupy.cuda.runtime.getDevice())  # as the storage tiers: bound at construction
            with self._device():
                self._alloc()
        else:
            self._alloc()

    def _alloc(self) -> None:
        self.tree = self.ops.new_tree(self.capacity)
        P = self.tree.shape[0] // 2
        if self.on_device:
            self.leaves = np.full(self.capacity, self._empty, dtype=np.float64)  # host mirror
            if self._scratch is None:
                self._scratch = self.ops.new_scratch(self.tree)
        else:
            self.leaves = self.tree[P : P + self.capacity]  # a view of the leaf level

    @contextmanager
    def _device(self):
        """On this tree's device and current stream, after the fence; records the new fence on exit."""
        cp = self._cp
        with cp.cuda.Device(self.device_id):
            s = cp.cuda.get_current_stream()
            if self._fence is not None:
                s.wait_event(self._fence)
            yield s
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(s)
            self._fence = ev

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """``leaf[slots[k]] = values[k]`` (duplicates: the last wins), parents repaired."""
        slots = np.asarray(slots, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if not self.on_device:
            self.ops.set_leaves(self.tree, slots, values)
            return
        n = len(slots)
        if not n:
            return
        buf = np.empty(2 * n, dtype=np.float64)
        buf[:n] = slots.view(np.float64)
        buf[n:] = values
        with self._device() as stream:
            dev = self._cp.asarray(buf)  # one upload for both
            self.ops.set_leaves(self.tree, dev[:n].view(np.int64), dev[n:], scratch=self._scratch)
            self._changed(stream)
        self.leaves[slots] = values

    def _changed(self, stream) -> None:
        """Device: the tree was just changed on ``stream`` (called inside :meth:`_device`)."""

    @property
    def nbytes(self) -> int:
        """Bytes of the tree plus, on the device, of the host mirror."""
        return int(self.tree.nbytes) + (self.leaves.nbytes if self.on_device else 0)

    def state(self) -> np.ndarray:
        """A host copy of the whole tree (checkpoints)."""
        if not self.on_device:
            return self.tree.copy()
        with self._device():
            return self.tree.get()

    def place(self, array: np.ndarray, copy: bool = True) -> None:
        """Keep the (host) tree in ``array`` from now on: shared memory, or a mapped file of a disk shard.

        Parameters
        ----------
        array : numpy.ndarray
            float64, of the tree's shape.
        copy : bool, default True
            Copy the tree into it; False adopts what it holds (a disk shard reopened).
        """
        if self.on_device or array.shape != self.tree.shape:
            raise ValueError(f"a host tree of shape {self.tree.shape} cannot live in {array.shape} here")
        if copy:
            array[...] = self.tree
        self.tree = array
        P = array.shape[0] // 2
        self.leaves = array[P : P + self.capacity]

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves, level by level (host trees).

        A node is what :func:`~gear_flow.ops.sumtree.set_leaves` makes it (the
        combination of its two children), so a rebuilt tree equals the one
        updated leaf by leaf; a disk shard reopened after a kill rebuilds its
        trees, whose last update may have been cut short.
        """
        t = self.tree
        width = t.shape[0] // 4
        while width >= 1:
            self._combine(t[2 * width : 4 * width : 2], t[2 * width + 1 : 4 * width : 2], out=t[width : 2 * width])
            width //= 2

    def load(self, tree: np.ndarray) -> None:
        """Replace the tree by a host array of the same shape (checkpoints)."""
        tree = np.asarray(tree, dtype=np.float64)
        if tree.shape != self.tree.shape:
            raise ValueError(f"tree of shape {tree.shape} for one of shape {self.tree.shape}")
        if not self.on_device:
            self.tree[:] = tree
            return
        P = tree.shape[0] // 2
        with self._device() as stream:
            self.tree = self._cp.asarray(tree)
            self._changed(stream)
        self.leaves = tree[P : P + self.capacity].copy()


class SumTree(_Tree):
    """Per-slot sampling weights in a sum tree (see the module docstring).

    Parameters
    ----------
    ops : SelectionOps
        The tier's operations (:func:`gear_flow.backend.selection_ops`).
    capacity : int
        Slots (leaves) the tree holds.

    Examples
    --------
    >>> import numpy as np
    >>> from gear_flow import backend
    >>> t = SumTree(backend.selection_ops("host"), 4)
    >>> t.set(np.array([0, 2]), np.array([1.0, 3.0]))
    >>> t.mass, t.draw(np.array([0.5])).tolist()
    (4.0, [2])
    """

    _empty = 0.0
    _combine = staticmethod(np.add)

    def __init__(self, ops: SelectionOps, capacity: int):
        self._pending = None  # inside one_repair(): the leaves set whose tree is not changed yet
        self._owner = None  # the thread in one_repair()
        self._repair_buf = np.zeros(0, dtype=np.int64)  # host: the held leaves and the repair's nodes, reused
        self._mass = 0.0  # device: the root on the host, None while its copy is in flight
        self._root = None  # device: pinned float64[1] the root is copied into after each change
        self._root_copied = None  # device: the event after that copy
        super().__init__(ops, ops.sumtree, capacity)

    def _changed(self, stream) -> None:
        cp = self._cp
        if self._root is None:
            self._root_mem = cp.cuda.alloc_pinned_memory(8)
            self._root = np.frombuffer(self._root_mem, dtype=np.float64, count=1)
        cp.cuda.runtime.memcpyAsync(
            self._root.ctypes.data, self.tree[1:2].data.ptr, 8, cp.cuda.runtime.memcpyDefault, stream.ptr
        )
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        self._root_copied = ev
        self._mass = None

    @contextmanager
    def one_repair(self) -> Iterator[None]:
        """Leaves set inside change the tree once, on the way out, for all of them: an insert that overwrites
        ring slots removes the evicted items and weighs the new ones in one pass over the tree, not two (on
        the host the leaves are written at once and their parents recomputed on the way out; on the device
        the changes go up in one upload and one launch).  Reading the tree inside (its mass, a draw, a tail
        mass) applies them first; leaf weights read the leaves (the host mirror on the device).  Nested:
        the outermost applies.
        """
        if self._pending is not None:
            yield
            return
        self._pending, self._owner = [], threading.get_ident()
        try:
            yield
        finally:
            self._apply_pending()
            self._pending = None

    def _held_here(self) -> bool:
        """Changes are held back by :meth:`one_repair` in this thread: a read here applies them first.  A
        read in another thread (one that does not take the shard's lock) leaves them to their owner and sees
        the tree as it was, as it saw a tree mid-update before."""
        return bool(self._pending) and self._owner == threading.get_ident()

    def _apply_pending(self) -> None:
        """What :meth:`one_repair` has held back: the host's repair of the leaves written, or the device's
        one update of every ``(slots, values)`` set in order (repeats: the last wins, as within one)."""
        pending = self._pending
        if not pending:
            return
        self._pending = None  # (the device's set below runs outside the hold)
        try:
            if self.on_device:
                slots = np.concatenate([s for s, _ in pending])
                super().set(slots, np.concatenate([v for _, v in pending]))
            else:  # the leaves' indices and the repair's nodes in two reused buffers (no fresh pages)
                n = sum(map(len, pending))
                if len(self._repair_buf) < 2 * n:
                    self._repair_buf = np.empty(2 * n, dtype=np.int64)
                idx = np.concatenate(pending, out=self._repair_buf[:n])
                self.ops.repair(self.tree, idx, self._repair_buf[n : 2 * n])
        finally:
            pending.clear()
            self._pending = pending

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """``leaf[slots[k]] = values[k]`` (duplicates: the last wins), parents repaired (inside
        :meth:`one_repair`: on its way out).

        Parameters
        ----------
        slots : int64 array
            Leaves to set.
        values : float64 array
            Their values, one per slot.
        """
        if self._pending is None:
            return super().set(slots, values)
        slots = np.asarray(slots, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if self.on_device:
            self._pending.append((slots, values))
            self.leaves[slots] = values  # the host mirror: leaf weights read inside see the change
        else:
            self.ops.write_leaves(self.tree, slots, values)
            self._pending.append(slots)

    @property
    def mass(self) -> float:
        """Total weight (the root); on the device the copy queued by the last change."""
        if self._held_here():
            self._apply_pending()
        if not self.on_device:
            return float(self.tree[1])
        if self._mass is None:
            self._root_copied.synchronize()
            self._mass = float(self._root[0])
        return self._mass

    def set_const(self, slots: np.ndarray, value: float) -> None:
        """Every ``leaf[slots[k]] = value``.

        Parameters
        ----------
        slots : int64 array
            Leaves to set (duplicates harmless).
        value : float
            The weight they all get.
        """
        slots = np.asarray(slots, dtype=np.int64)
        if self._pending is not None:
            if self.on_device:
                return self.set(slots, np.full(len(slots), float(value)))
            self.ops.write_leaves_const(self.tree, slots, float(value))
            self._pending.append(slots)
            return
        if not self.on_device:
            self.ops.set_leaves_const(self.tree, slots, float(value))
            return
        if not len(slots):
            return
        with self._device() as stream:
            self.ops.set_leaves_const(self.tree, self._cp.asarray(slots), float(value), scratch=self._scratch)
            self._changed(stream)
        self.leaves[slots] = value

    def reset(self, slots: np.ndarray, value: float) -> None:
        """Every leaf 0, then ``leaf[slots] = value`` (a new epoch).

        Parameters
        ----------
        slots : int64 array
            Leaves that get ``value``.
        value : float
            Their weight.
        """
        if self._pending:
            self._pending.clear()  # every leaf changes below
        if self.on_device:
            with self._device():
                self._alloc()  # a zeroed tree, ordered after the old one's last use
            self._mass = 0.0  # until set_const below changes it
        else:
            self.tree[:] = 0.0
        self.set_const(slots, value)

    def draw(self, uniforms: np.ndarray) -> np.ndarray:
        """The leaves holding ``uniforms * mass`` by inverse CDF (the mass must be positive).

        Host: ``find(tree, uniforms * mass)``.  Device: ``sample``, which does the
        same multiplication on the device, so both return the same leaves.

        Parameters
        ----------
        uniforms : float64 array
            Values in ``[0, 1)``, one per draw.

        Returns
        -------
        int64 array
            The drawn leaves (slots), on the host, in the order of ``uniforms``.
        """
        if self._held_here():  # (the descent reads the parents)
            self._apply_pending()
        uniforms = np.asarray(uniforms, dtype=np.float64)
        n = len(uniforms)
        if not self.on_device:
            out = np.empty(n, dtype=np.int64)
            self.ops.find(self.tree, uniforms * self.mass, out)
            return out
        if not n:
            return np.zeros(0, dtype=np.int64)
        with self._device():
            out = self._cp.empty(n, dtype=np.int64)
            self.ops.sample(self.tree, self._cp.asarray(uniforms), out)
            return out.get()

    def draw_probs(self, uniforms: np.ndarray, denom: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`draw`, and each drawn leaf's weight over ``denom``.

        Host: one compiled call (:func:`gear_flow.ops.sumtree.draw_probs`).  Device: the
        draw, then the weights from the host mirror of the leaves.

        Parameters
        ----------
        uniforms : float64 array
            Values in ``[0, 1)``, one per draw.
        denom : float
            What each weight is divided by (the mass the draw was among).

        Returns
        -------
        slots : numpy.ndarray
            int64, as :meth:`draw` returns them.
        probs : numpy.ndarray
            float64 ``weight / denom`` of each.
        """
        if self.on_device:
            out = self.draw(uniforms)
            return out, self.leaves[out] / denom
        if self._held_here():  # (the descent reads the parents)
            self._apply_pending()
        uniforms = np.asarray(uniforms, dtype=np.float64)
        out, probs = np.empty(len(uniforms), dtype=np.int64), np.empty(len(uniforms))
        self.ops.draw_probs(self.tree, uniforms, self.mass, float(denom), out, probs)
        return out, probs

    def ring_tail_mass(self, capacity: int, starts: np.ndarray, lengths: np.ndarray, k: int) -> float:
        """Mass of the last ``min(k, length)`` leaves of each ring segment, summed in order.

        See :func:`gear_flow.ops.sumtree.ring_tail_mass`; both twins sum in the same order.

        Parameters
        ----------
        capacity : int
            Ring length (positions wrap modulo it).
        starts, lengths : int64 arrays
            First ring position and length of each segment (episode).
        k : int
            Tail length per segment.

        Returns
        -------
        float
            The summed tail mass.
        """
        if self._held_here():  # (range sums read the parents)
            self._apply_pending()
        if not self.on_device:
            return float(self.ops.ring_tail_mass(self.tree, capacity, starts, lengths, k))
        with self._device():
            return float(self.ops.ring_tail_mass(self.tree, capacity, starts, lengths, k))


class MaxTree(_Tree):
    """Per-slot order values in a max tree; empty leaves hold ``-inf`` (see the module docstring).

    Parameters
    ----------
    ops : SelectionOps
        The tier's operations (:func:`gear_flow.backend.selection_ops`).
    capacity : int
        Slots (leaves) the tree holds.
    touched : callable, optional
        Returns the per-slot stamps (int64 ``[capacity]``, written before a
        slot's :meth:`set`) that break ties, the least first, once
        :meth:`keep_stamps` is called: the tree then keeps stamps of its own
        (:func:`gear_flow.ops.maxtree.new_stamps`) and :meth:`topk` ranks by
        them.  On the device, whose kernels have none, a host twin of the tree
        (built from the leaves' host mirror, then set with it) keeps them and
        answers :meth:`topk`.  Until then, and without ``touched``, ties rank
        by slot.

    Examples
    --------
    >>> import numpy as np
    >>> from gear_flow import backend
    >>> t = MaxTree(backend.selection_ops("host"), 4)
    >>> t.set(np.array([0, 1, 3]), np.array([2.0, 5.0, 2.0]))
    >>> [a.tolist() for a in t.topk(2)]
    [[1, 0], [5.0, 2.0]]
    >>> stamps = np.array([7, 0, 0, 3])
    >>> s = MaxTree(backend.selection_ops("host"), 4, touched=lambda: stamps)
    >>> s.set(np.array([0, 1, 3]), np.array([2.0, 5.0, 2.0]))
    >>> s.keep_stamps()
    True
    >>> [a.tolist() for a in s.topk(2)]
    [[1, 3], [5.0, 2.0]]
    """

    _empty = -np.inf
    _combine = staticmethod(np.maximum)

    def __init__(self, ops: SelectionOps, capacity: int, touched: Callable[[], np.ndarray] | None = None):
        super().__init__(ops, ops.maxtree, capacity)
        self._touched = touched
        self.stamps = None  # the internal nodes' stamps, once kept
        self._ranked = None  # the host tree the stamps are for: this one, or on the device its host twin
        #: the stamps do not match the values (just kept, or the values came from elsewhere: :meth:`load`,
        #: :meth:`place`, :meth:`rebuild`): they are recomputed before the next :meth:`topk`
        self._stale = False

    def keep_stamps(self) -> bool:
        """Rank ties by stamp from now on (a tree given ``touched``): stamps are kept for every node.

        They cost a second array, half the tree's size, and about as much
        memory traffic again on every :meth:`set`; on the device, a host twin
        of the tree as well, set with every change.  A heap asks for them once
        its ties are many (all priorities equal: the common case), when
        collecting and sorting the ties of each batch costs O(N).

        Returns
        -------
        bool
            Whether the tree ranks ties by stamp.
        """
        if self.stamps is None and self._touched is not None:
            self._ranked = host_maxtree.new_tree(self.capacity) if self.on_device else self.tree
            self.stamps = host_maxtree.new_stamps(self._ranked)
            self._stale = True
        return self.stamps is not None

    @property
    def stamped(self) -> bool:
        """Whether :meth:`topk` ranks ties by stamp (:meth:`keep_stamps`)."""
        return self.stamps is not None

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """``leaf[slots[k]] = values[k]`` (duplicates: the last wins), parents (and their stamps) repaired.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots; with stamps, their stamps already written to ``touched``.
        values : numpy.ndarray
            float64, one a slot (``-inf``: empty).
        """
        if self.stamps is None or self._stale or self.on_device:  # (a device tree and its mirror: always)
            super().set(slots, values)
        if self.stamps is not None and not self._stale:  # the tree, or the device tree's twin, with stamps
            slots = np.asarray(slots, dtype=np.int64)
            values = np.asarray(values, dtype=np.float64)
            host_maxtree.set_leaves_stamped(self._ranked, self.stamps, self._touched(), slots, values)

    def _restamp(self) -> None:
        if self._stale:
            if self.on_device:  # the twin's leaves from the mirror (equal to the device's bit for bit)
                P = self._ranked.shape[0] // 2
                self._ranked[P : P + self.capacity] = self.leaves
            host_maxtree.restamp(self._ranked, self.stamps, self._touched())
            self._stale = False

    def load(self, tree: np.ndarray) -> None:
        """Replace the tree by a host array of the same shape (checkpoints); stamps recomputed when next read.

        Parameters
        ----------
        tree : numpy.ndarray
            float64, of the tree's shape.
        """
        super().load(tree)
        self._stale = self.stamps is not None

    def place(self, array: np.ndarray, copy: bool = True) -> None:
        """Keep the tree in ``array`` (see :meth:`_Tree.place`); stamps recomputed when next read."""
        super().place(array, copy)
        if self.stamps is not None:
            self._ranked, self._stale = self.tree, True

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (see :meth:`_Tree.rebuild`); stamps when next read."""
        super().rebuild()
        self._stale = self.stamps is not None

    @property
    def nbytes(self) -> int:
        """Bytes of the tree plus its stamps and, on the device, its host mirror and twin."""
        if self.stamps is None:
            return super().nbytes
        return super().nbytes + int(self.stamps.nbytes) + (int(self._ranked.nbytes) if self.on_device else 0)

    def equal(self, value: float, limit: int) -> np.ndarray:
        """The slots whose leaf equals ``value``, ascending.

        A host tree finds them from the root through the subtrees whose maximum
        is at least ``value`` (:func:`gear_flow.ops.maxtree.leaves_equal`), as
        long as no level holds more than ``limit`` of those; otherwise, and on
        the device, the leaves (a device tree's host mirror) are scanned.

        Parameters
        ----------
        value : float
            The value (not ``-inf``: every empty leaf holds that).
        limit : int
            The most nodes a level of the search may hold before the scan is cheaper.

        Returns
        -------
        numpy.ndarray
            int64 slots, ascending.
        """
        if not self.on_device:
            out = np.empty(max(int(limit), 1), dtype=np.int64)
            found = self.ops.leaves_equal(self.tree, float(value), self.capacity, out)
            if found >= 0:
                return out[:found]
        return np.flatnonzero(self.leaves == value)

    def topk(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` largest leaves that are not ``-inf``, descending (ties: least stamp first when
        :attr:`stamped`, then lower index first).

        Parameters
        ----------
        k : int
            How many (fewer come back when fewer leaves are set).

        Returns
        -------
        idx : int64 array
            Their slots, on the host.
        val : float64 array
            Their values, on the host.
        """
        k = max(int(k), 0)
        if self.stamps is not None:  # ties by stamp, on the host (the tree, or the device tree's twin)
            self._restamp()
            idx = np.empty(k, dtype=np.int64)
            val = np.empty(k, dtype=np.float64)
            found = host_maxtree.topk_stamped(self._ranked, self.stamps, self._touched(), k, idx, val)
            return idx[:found], val[:found]
        if not self.on_device:
            idx = np.empty(k, dtype=np.int64)
            val = np.empty(k, dtype=np.float64)
            found = self.ops.topk(self.tree, k, idx, val)
            return idx[:found], val[:found]
        want = min(k, self.tree.shape[0] // 2)
        if not want:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        with self._device():
            buf = self._cp.empty(2 * want, dtype=np.float64)
            found = self.ops.topk(self.tree, k, buf[:want].view(np.int64), buf[want:])
            host = buf.get()  # indices and values in one copy
        return host[:found].view(np.int64).copy(), host[want : want + found].copy()
