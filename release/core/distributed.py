"""Several processes under ``torchrun``: ``release build`` and ``release verify`` split their builds across ranks,
``release eval`` its rollouts, ``release build`` its calibration capture.

Each unit of work (one build, one observation's capture, one rollout) is independent of the others and of the
process that does it, and each is already a file of its own (the build folder, the capture and rollout caches): a
rank does its share, ``barrier()`` waits for all shares, and rank 0 merges, reading the same files one process
would have written under the same cache keys. On a GPU machine each rank runs on the GPU of its ``LOCAL_RANK``.

The ranks meet through torchrun's key-value store only (``torch.distributed.rendezvous``), never a default process
group: ModelOpt all-reduces every quantizer's amax over the default group whenever one exists (data-parallel
calibration), which would merge the scales of different builds calibrating on different ranks. torchrun stops
every rank when one fails, so a failed share never leaves the others waiting.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from release.core.errors import ReleaseError

T = TypeVar("T")
# The commands that split their work; any other refuses to run under several processes.
COMMANDS = ("build", "verify", "eval")
TIMEOUT_ENV = "RELEASE_DIST_TIMEOUT"


@dataclass
class World:
    rank: int = 0
    size: int = 1
    store: Any = None  # torch.distributed.Store of the rendezvous; None in a single process
    rounds: int = 0  # barriers passed: every rank passes the same ones in the same order

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def tag(self) -> str:
        """A prefix for progress lines, empty in a single process."""
        return f"[rank {self.rank}/{self.size}] " if self.size > 1 else ""

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's items: every ``size``-th, from its rank on (the same split on every rank)."""
        return list(items[self.rank::self.size])

    def unfinished(self, items: Sequence[T], done: Callable[[T], bool]) -> tuple[list[T], list[T]]:
        """The items not done yet, and this rank's share of them, the same split on every rank: each rank lists
        them, then waits until every rank has listed before any starts (a rank that started late would otherwise
        list after another rank's first results, split a shorter list, and leave items to nobody)."""
        missing = [item for item in items if not done(item)]
        self.barrier()
        return missing, self.share(missing)

    def barrier(self, failures: int = 0) -> int:
        """Wait until every rank got here; the sum of the ranks' ``failures``."""
        if self.store is None:
            return failures
        self.rounds += 1
        key = f"release/barrier/{self.rounds}"
        self.store.add(f"{key}/failures", failures)
        if self.store.add(f"{key}/arrived", 1) == self.size:
            self.store.set(f"{key}/done", "1")
        self.store.wait([f"{key}/done"])
        return int(self.store.add(f"{key}/failures", 0))

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (each rank gets the same answer)."""
        return self.barrier(0 if flag else 1) == 0


_CURRENT = [World()]


def world() -> World:
    return _CURRENT[-1]


def join(command: str | None) -> World:
    """Join torchrun's rendezvous for ``command`` (a single process when ``WORLD_SIZE`` is unset or 1)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 or world().size > 1:
        return world()
    if command not in COMMANDS:
        raise ReleaseError(f"'release {command}' does not split across processes (WORLD_SIZE={size}); run it without "
                           f"torchrun (the commands that do: {', '.join(COMMANDS)})")
    import torch
    import torch.distributed as dist

    from release.core.device import compute_device

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if compute_device() == "cuda":
        if local >= torch.cuda.device_count():
            raise ReleaseError(f"torchrun started local rank {local}, torch sees {torch.cuda.device_count()} GPUs; "
                               "pass --nproc-per-node at most that, or RELEASE_DEVICE=cpu")
        torch.cuda.set_device(local)
    try:
        timeout = dt.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "86400")))
    except ValueError:
        raise ReleaseError(f"{TIMEOUT_ENV}={os.environ[TIMEOUT_ENV]}: expected seconds") from None
    store, rank, size = next(dist.rendezvous("env://", rank, size, timeout=timeout))
    store.set_timeout(timeout)
    _CURRENT.append(World(rank, size, store))
    return world()
