"""Cases that run in a Python process of their own, still interleaved with the others.

A framework's step is measured in the process it would run in: its own
allocator state and settings (pretextual's Trainer sets glibc's malloc to
keep freed memory, process-wide; a Hugging Face user's process has glibc's
defaults) and no other library's threads or heap beside it. The parent
drives every case round by round as before (:func:`benchmarks.timing.interleave`);
an isolated case is timed inside its own process, while the others wait
blocked on a pipe.

A side is built in the child by a module-level ``factory(*args)`` that
returns ``{case name: Case}`` (a case may also be called untimed for a
value, :meth:`Isolated.call`); it gets its inputs as pickled arguments
(sizes, tensors, file paths) and builds its models itself.
"""

from __future__ import annotations

import importlib
import multiprocessing
import time
import traceback
from dataclasses import dataclass


def _serve(conn, factory: str, args: tuple, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    try:
        module, name = factory.split(":")
        cases = getattr(importlib.import_module(module), name)(*args)
    except BaseException:  # report it to the parent, which raises it with the child's traceback
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", list(cases)))
    while True:
        message = conn.recv()
        if message is None:
            return
        try:
            if isinstance(message, tuple):  # ("call", name): the case's own return value, untimed
                conn.send(("done", cases[message[1]]()))
                continue
            start, cpu = time.perf_counter(), time.process_time()
            work = cases[message]()
            conn.send(("done", (time.perf_counter() - start, float(work),
                                time.process_time() - cpu)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


class Isolated:
    """A side of a comparison in a spawned process; use as a context manager."""

    def __init__(self, factory: str, *args, threads: int):
        context = multiprocessing.get_context("spawn")  # no fork of a process running OpenMP
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, factory, args, threads),
                                       daemon=True)
        self.process.start()
        child.close()
        try:
            self.names = self._reply(f"building {factory}")
        except BaseException:
            self.close()
            raise

    def _reply(self, doing: str):
        try:
            kind, value = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"the benchmark process {doing} died "
                               f"(exit code {self.process.exitcode})") from None
        if kind == "error":
            raise RuntimeError(f"the benchmark process failed {doing}:\n{value}")
        return value

    def case(self, name: str) -> "RemoteCase":
        if name not in self.names:
            raise KeyError(f"{name!r}: the isolated side has {self.names}")
        return RemoteCase(self, name)

    def cases(self, prefix: str = "") -> dict[str, "RemoteCase"]:
        """Every case of the side, named ``prefix + name``."""
        return {prefix + name: self.case(name) for name in self.names}

    def call(self, name: str):
        """Run case ``name`` once, untimed, and return what it returns (e.g. its statistics)."""
        self.conn.send(("call", name))
        return self._reply(f"calling {name!r}")

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()

    def __enter__(self) -> "Isolated":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class RemoteCase:
    """One case of an :class:`Isolated` side; :func:`benchmarks.timing.interleave`
    takes its (seconds, work, CPU seconds) as measured in the child."""

    side: Isolated
    name: str

    def timed(self) -> tuple[float, float, float]:
        self.side.conn.send(self.name)
        return self.side._reply(f"running {self.name!r}")
