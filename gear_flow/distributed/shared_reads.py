"""Reading a sample's windows from shared memory: the copy, the seqlock check, and redraws of torn rows."""

from __future__ import annotations

import numpy as np

from .. import backend
from ..ops.gather import gather_windows
from ..sample import SampleBuffers
from ..table.executor import fill_rows
from .transport import Retry


class SharedReads:
    """Part of :class:`~gear_flow.distributed.remote_sample.RemoteSample` (needs ``t``, ``out``, ``columns``, ``L``,
    ``boundary``, ``rng``, ``txn`` and ``counted``)."""

    def _copy_shared(self, sh, r, o: int) -> np.ndarray:
        """Copy a part's windows from a mapped shared ring into rows ``o:``; returns the torn rows (seqlock)."""
        n = len(r["seqs"])
        src = np.asarray(r["src_abs"], dtype=np.int64)
        if self.out.on_device:  # a pinned table: this process's GPU reads the page-locked segments
            from ..gpu.shared import gather_shared

            gather_shared(
                sh, self.columns, src, np.asarray(r["dst_offset"]), np.asarray(r["n_valid"]), self.out.bytes, o
            )
            return np.flatnonzero(~sh.intact(src))
        for c in self.columns:
            gather_windows(sh.bytes[c], src % sh.capacity, np.asarray(r["dst_offset"]), np.asarray(r["n_valid"]),
                           self.out.bytes[c][o : o + n])  # fmt: skip
        return np.flatnonzero(~sh.intact(src))  # read after the copy

    async def _redraw(self, a, sh, s: int, o: int, torn: np.ndarray, args: dict) -> None:
        """Rows whose windows were overwritten while being copied: draw them again from shard ``s``.

        Each redrawn row reports the probability of its own draw (the shard's
        first-level share, its mass at the redraw); the abandoned draws are
        uncounted at the owner.  A writer that overtakes the reader every time
        makes the whole sample retry.
        """
        t, out = self.t, self.out
        given = 0
        for _ in range(16):
            k = len(torn)
            args = {**args, "counts": {s: k}, "scale": {s: args["scale"][s]}, "seed": int(self.rng.integers(2**63)),
                    "updates": None}  # fmt: skip
            r = (await t._link.on_workers({a: ("sample_part", args)}))[a][s]
            self.counted[a][s] = self.counted[a].get(s, 0) + k
            given += k
            tmp = SampleBuffers(t.spec, self.columns, k, self.L, tier=out.tier)
            sub = type(self)(t, tmp, self.L, self.boundary, self.columns, self.rng, self.txn, True, None)
            again = sub._copy_shared(sh, r, 0)
            fill_rows(
                tmp, 0, s, r["seqs"], r["p"], r["episode_ids"], r["timesteps"], r["dst_offset"], r["n_valid"], self.L,
                r.get("priorities"), r.get("times_sampled"),
            )  # fmt: skip
            ok = np.setdiff1d(np.arange(k), again)
            rows = o + torn[ok]
            xp = backend.output_module(out.tier)  # indices go where the data is
            for c in self.columns:
                out.bytes[c][xp.asarray(rows)] = tmp.bytes[c][xp.asarray(ok)]
            for f in ("keys", "probabilities", "episode_ids", "timesteps", "mask", "priorities", "times_sampled"):
                getattr(out, f)[rows] = getattr(tmp, f)[ok]
            torn = torn[again]
            if not len(torn):
                self.counted[a][s] -= given  # before: a failed uncount must not be undone again
                await t._link.on_workers({a: ("uncount", dict(name=t.name, counts={s: given}))})  # the torn draws
                return
            t.stats["shared_conflicts"] += len(torn)
        raise Retry()
