"""Start the CLI of the adversarial suite in a fresh process without paying for its imports each time.

A *zygote* process imports what every verb imports (numpy, pandas, pyarrow, msgspec, profparse's data path) once
per test worker; each run is a process forked from it that then does what ``python -m profparse.cli.main ARGV``
does after its imports: its own session, working folder, environment and standard streams, the module run as
``__main__`` (``runpy``, as ``-m`` does), and ``entry()``'s exit. The test sees a real process: its pid, its exit
code or signal, its session's workers, its pipes. About 0.4 s of imports per run are saved (hundreds of runs).

What a zygote cannot reproduce, :func:`suits` sends to a plain interpreter instead: a signal sent while the run
starts, an environment that changes how Python or Arrow start, standard streams other than pipes; and so does
``run_cli(..., fresh=True)`` (a run timed to place a signal in the runs that follow it).
``PROFPARSE_TEST_FRESH_CLI=1`` sends every run to a plain interpreter; ``PROFPARSE_TEST_STACK_AFTER=SECONDS`` in a
run's environment prints its Python stack and ends it after that long (to see where a run hangs).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
FRESH_ENV = "PROFPARSE_TEST_FRESH_CLI"
#: environment variables read as an interpreter or a library starts: a run that sets one gets a plain interpreter
_STARTUP_PREFIXES = ("PYTHON", "LANG", "LC_", "MALLOC_", "ARROW_", "OMP_", "OPENBLAS_", "MKL_", "TZ")

# the zygote: imports once, then forks one child per request (a SOCK_SEQPACKET message: JSON + three fds) and
# reports each child's pid and, when it ends, its exit code
_ZYGOTE = r"""
import json, os, select, signal, socket, sys, traceback
sock = socket.socket(fileno=int(sys.argv[1]))
from profparse.trace.budget import map_big_allocations, use_system_allocator
use_system_allocator()  # as entry() does, before pyarrow is imported
map_big_allocations()
import numpy, pandas, pyarrow, pyarrow.parquet, msgspec  # noqa: F401
import profparse.cli.main, profparse.api, profparse.outputs.summary, profparse.outputs.parquet  # noqa: F401
start_env = dict(os.environ)

def child(request, fds):
    sock.close()
    os.setsid()
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    if request["cpus"] and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, request["cpus"])  # the CPUs the test process may use, as a child inherits them
    os.environ.clear()
    os.environ.update(request["env"])
    import tempfile
    tempfile.tempdir = None  # read from TMPDIR again
    sys.path[0] = os.getcwd()  # as -m puts the working folder first
    sys.argv = ["-m", *request["argv"]]
    sys.modules.pop("profparse.cli.main", None)  # as under -m: the module runs as __main__ only
    if os.environ.get("PROFPARSE_TEST_STACK_AFTER"):
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["PROFPARSE_TEST_STACK_AFTER"]), exit=True)
    import runpy
    try:
        runpy.run_module("profparse.cli.main", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)

while True:
    ready, _, _ = select.select([sock], [], [], 0.005)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
    if not ready:
        continue
    message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
    if not message:
        break
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        child(request, fds)
    for fd in fds:
        os.close(fd)
    sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())
"""


class ZygoteProcess:
    """A run forked by the zygote, with what the harness uses of :class:`subprocess.Popen`."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self.zygote.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(["profparse"], timeout or 0.0)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


class Zygote:
    """One zygote per test worker and environment it was started with."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd=REPO,
        )
        theirs.close()
        self.sock = ours
        self.lock, self.changed = threading.Lock(), threading.Condition()
        self.pids: dict[int, int] = {}  # request id -> the pid it started
        self.exits: dict[int, int] = {}  # pid -> exit code (negative: the signal that ended it)
        self.gone = False  # the zygote ended: every wait ends
        self.next_id = 0
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                message = self.sock.recv(1 << 16)
            except OSError:
                message = b""
            with self.changed:
                if not message:
                    self.sock.close()
                    self.gone = True
                    self.changed.notify_all()
                    return
                reply = json.loads(message)
                if "exit" in reply:
                    self.exits[reply["exit"]] = reply["code"]
                else:
                    self.pids[reply["id"]] = reply["pid"]
                self.changed.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.gone

    def start(self, argv: list[str], env: dict[str, str], cwd: Path | None, fds: tuple[int, int, int]) -> int:
        with self.lock:
            self.next_id += 1
            request_id = self.next_id
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            request = {"id": request_id, "argv": argv, "env": env, "cwd": str(cwd or os.getcwd()), "cpus": cpus}
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
        with self.changed:
            if not self.changed.wait_for(lambda: request_id in self.pids or self.gone, timeout=60):
                raise RuntimeError("the CLI zygote did not answer")
            if request_id not in self.pids:
                raise RuntimeError("the CLI zygote ended")
            return self.pids.pop(request_id)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self.changed:
            self.changed.wait_for(lambda: pid in self.exits or self.gone, timeout=timeout)
            if pid in self.exits:
                return self.exits.pop(pid)
            if self.gone:
                raise RuntimeError("the CLI zygote ended while a run was going")
            return None


_ZYGOTES: dict[str, Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def suits(
    env: dict[str, str],
    base: dict[str, str],
    stdin: int | None,
    stdout: int | None,
    signal_after: object,
    fresh: bool = False,
) -> bool:
    """Whether a run with ``env`` can start from the zygote started with ``base`` (see the module's docstring;
    ``fresh``: the caller asks for a plain interpreter)."""
    if not sys.platform.startswith("linux"):  # SOCK_SEQPACKET and fd passing as Linux has them
        return False
    if os.environ.get(FRESH_ENV) or fresh or signal_after is not None or stdout is not None:
        return False
    if stdin not in (None, subprocess.DEVNULL):
        return False
    startup = {k for k in (*env, *base) if k.startswith(_STARTUP_PREFIXES)}
    return all(env.get(k) == base.get(k) for k in startup)


def spawn(
    argv: list[str], env: dict[str, str], base: dict[str, str], cwd: Path | None
) -> tuple[ZygoteProcess, IO[bytes], IO[bytes]]:
    """Start ``argv`` with ``env`` from the zygote of ``base`` (started on first use): the process and its stdout
    and stderr."""
    # by what is read as Python and its libraries start (not by the whole environment: pytest sets
    # PYTEST_CURRENT_TEST for each test); one zygote at a time, each holds the imports' memory
    key = json.dumps({k: v for k, v in base.items() if k.startswith(_STARTUP_PREFIXES)}, sort_keys=True)
    with _ZYGOTES_LOCK:
        zygote = _ZYGOTES.get(key)
        if zygote is None or not zygote.alive():
            shutdown()
            zygote = _ZYGOTES[key] = Zygote(base)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        pid = zygote.start(argv, env, cwd, (devnull, out_w, err_w))
    finally:
        for fd in (out_w, err_w, devnull):
            os.close(fd)
    return ZygoteProcess(zygote, pid), os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")


def shutdown() -> None:
    """Stop the zygotes (a zygote also ends when its test worker does: it reads the end of its socket)."""
    for zygote in _ZYGOTES.values():
        try:
            zygote.sock.shutdown(socket.SHUT_RDWR)  # wakes the listening thread; the zygote reads its end
        except OSError:
            pass
        try:
            zygote.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            zygote.proc.kill()
    _ZYGOTES.clear()


__all__ = ["FRESH_ENV", "ZygoteProcess", "shutdown", "spawn", "suits"]
