"""torch.distributed as torchrun sets it up: one process per device, DDP across them.

pretextual invents no distribution of its own: ``torchrun --nproc_per_node N -m
pretextual train ...`` sets RANK, WORLD_SIZE and LOCAL_RANK, and this module
reads them. Without torchrun everything here is a no-op for a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pretextual.errors import ConfigError


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Only the main process writes checkpoints, metrics and exports."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_world(device: torch.device) -> World:
    """Join the process group torchrun describes (gloo on CPU, nccl on GPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return World()
    world = World(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=30))
    return world


def device_for(name: str) -> torch.device:
    """'auto' picks cuda when available; under torchrun each process takes its LOCAL_RANK GPU.
    A CUDA device on a machine without one is a ConfigError naming trainer.device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name}: CUDA is not available on this machine "
                          f"(use trainer.device=cpu or auto)")
    if name == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device(name)


def mean_over_ranks(values: dict[str, torch.Tensor], world: World, device: torch.device
                    ) -> dict[str, float]:
    """Average logged values across processes (one all-reduce), as Python floats."""
    keys = sorted(values)
    stacked = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=device) for k in keys])
    if world.enabled:
        dist.all_reduce(stacked)
        stacked /= world.world_size
    return dict(zip(keys, stacked.tolist()))


def sum_over_ranks(values: tuple[int, ...], world: World, device: torch.device) -> tuple[int, ...]:
    """The sums of integers over processes (one all-reduce), on every process."""
    if not world.enabled:
        return values
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return tuple(t.tolist())


def first_flagged(step: torch.Tensor, flags: torch.Tensor, world: World) -> tuple[int, list[bool]]:
    """The smallest non-negative ``step`` over processes (-1 when every one is -1) and the
    ``flags`` of a process that holds it, on every process (two all-reduces)."""
    if not world.enabled:
        return int(step), [bool(f) for f in flags.tolist()]
    never = torch.iinfo(torch.int64).max
    first = torch.where(step < 0, never, step).to(torch.int64)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    mine = (step == first).to(torch.int64) * flags.to(torch.int64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return (-1 if int(first) == never else int(first)), [bool(f) for f in mine.tolist()]


def any_over_ranks(flag: bool, world: World, device: torch.device) -> bool:
    """True on every process when it is True on any (e.g. a plugin asked to stop on rank 0)."""
    if not world.enabled:
        return flag
    t = torch.tensor(int(flag), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t)


def broadcast_text(text: str | None, world: World, device: torch.device) -> str:
    """The main process's ``text`` on every process (the others pass None)."""
    if not world.enabled:
        return text
    box = [text]
    dist.broadcast_object_list(box, src=0, device=device)  # nccl: through this process's GPU
    return box[0]


def gather_rng_states(world: World, device: torch.device) -> list[torch.Tensor]:
    """Every process's RNG state (CPU, and the device's on cuda), in rank order."""
    state = torch.get_rng_state()
    if device.type == "cuda":
        state = torch.cat([state, torch.cuda.get_rng_state(device)])
    if not world.enabled:
        return [state]
    local = state.to(device)
    states = [torch.empty_like(local) for _ in range(world.world_size)]
    dist.all_gather(states, local)
    return [s.cpu() for s in states]


def set_rng_state(state: torch.Tensor, device: torch.device) -> None:
    """Restore a state written by gather_rng_states."""
    cpu = torch.get_rng_state()
    torch.set_rng_state(state[:len(cpu)])
    if device.type == "cuda" and len(state) > len(cpu):
        torch.cuda.set_rng_state(state[len(cpu):], device)


def barrier(world: World) -> None:
    """Wait until every process gets here (nothing without torchrun)."""
    if world.enabled:
        dist.barrier()


def shutdown(world: World) -> None:
    """Leave the process group at the end of a run (nothing without torchrun)."""
    if world.enabled:
        leave_process_group()


def leave_process_group() -> None:
    """Destroy this process's process group, if it joined one (a clean exit under torchrun)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
