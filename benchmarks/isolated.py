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
    except Exception:  # report it to the parent, which raises it with the child's traceback
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", list(cases)))
    cuda = torch.cuda.is_available()
    while True:
        message = conn.recv()
        if message is None:
            return
        try:
            if isinstance(message, tuple):  # ("call", name): the case's own return value, untimed
                conn.send(("done", cases[message[1]]()))
                continue
            if cuda:
                torch.cuda.synchronize()
            start, cpu = time.perf_counter(), time.process_time()
            work = cases[message]()
            if cuda:
                torch.cuda.synchronize()
            conn.send(("done", (time.perf_counter() - start, float(work),
                                time.process_time() - cpu)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


class Isolated:
    """A side of a comparison in a spawned process; use as a context manager."""

    def __init__(self, factory: str, *args, threads: int, timeout: float = 1800.0):
        """``factory``: "module:function" building the side in the child from ``args``
        (pickled: pass copies of tensors the parent keeps timing on, since pickling
        moves a tensor's storage to shared memory); ``timeout``: seconds any one
        reply may take before the child is taken for hung."""
        context = multiprocessing.get_context("spawn")  # no fork of a process running OpenMP
        self.timeout = timeout
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, factory, args, threads),
                                       daemon=True)
        try:
            self.process.start()
            child.close()
            self.names = self._reply(f"building {factory}")
        except BaseException:
            child.close()
            self.close()
            raise

    def _send(self, message, doing: str) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            raise RuntimeError(f"the benchmark process died before {doing} "
                               f"(exit code {self.process.exitcode})") from None

    def _reply(self, doing: str):
        try:
            if not self.conn.poll(self.timeout):
                raise RuntimeError(f"the benchmark process gave no answer {doing} in "
                                   f"{self.timeout:.0f} s")
            kind, value = self.conn.recv()
        except (EOFError, ConnectionResetError):
            self.process.join(timeout=5)
            raise RuntimeError(f"the benchmark process died {doing} "
                               f"(exit code {self.process.exitcode})") from None
        if kind == "error":
            raise RuntimeError(f"the benchmark process failed {doing}:\n{value}")
        return value

    def case(self, name: str) -> "RemoteCase":
        if name not in self.names:
            raise KeyError(f"{name!r}: the isolated side has {self.names}")
        return RemoteCase(self, name)

    def call(self, name: str):
        """Run case ``name`` once, untimed, and return what it returns (e.g. its statistics)."""
        self._send(("call", name), f"calling {name!r}")
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
        self.side._send(self.name, f"running {self.name!r}")
        return self.side._reply(f"running {self.name!r}")
