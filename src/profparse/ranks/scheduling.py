"""Running the rank tasks: in this process, in local worker processes (forkserver), or on a Dask cluster."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from profparse.base.errors import ProfparseError, UsageError, install_hint
from profparse.ranks.results import RankResult, RankTask
from profparse.ranks.worker import run_rank


def _failed(task: RankTask, message: str, exit_code: int = 70) -> RankResult:
    return RankResult(path=task.path, rank=task.rank, source=task.source, ok=False, error=message, exit_code=exit_code)


def _worker_start(parent: int, environment: dict[str, str]) -> None:
    """In each pool worker: take the parent's environment as it is now (the forkserver the worker was forked from
    keeps the one it started with, so e.g. a changed PROFPARSE_CACHE_DIR would not reach it), leave Ctrl-C to the
    parent (it stops the pool; a worker's own KeyboardInterrupt only printed a traceback), and exit as soon as the
    parent is gone (SIGKILL, SIGTERM), rather than wait forever for work from it. Linux also gets the kernel's
    parent-death signal, for the forkserver the worker was forked from.
    """
    import signal
    import threading

    os.environ.clear()
    os.environ.update(environment)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(parent, 0)
            except (ProcessLookupError, PermissionError):  # gone (or its pid reused by another user)
                os._exit(1)

    threading.Thread(target=watch, name="profparse-parent-watch", daemon=True).start()


DIED = "the worker process died (killed or out of memory; a script must start it under `if __name__ == '__main__':`)"


#: Set while a pool starts: the file a worker that re-imports a script calling ``parse_ranks`` at import writes.
NOTE_ENV = "PROFPARSE_POOL_NOTE"
NO_MAIN_GUARD = (
    "parse_ranks(..., jobs=N) ran again in its own worker process: multiprocessing starts each worker by importing "
    "the calling script again, and this script calls parse_ranks when imported; put the call under "
    "`if __name__ == '__main__':` (or use jobs=1)"
)


def _importing_main() -> bool:
    """True while multiprocessing runs the user's script again in a process it started (as ``__mp_main__``)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return True
        frame = frame.f_back
    return False


def refuse_in_pool_import() -> None:
    """In a process of profparse's pool that is importing the user's script, and the script calls
    ``parse_ranks`` at import (no ``if __name__ == '__main__':``): leave a note for the parent and exit, instead of
    waiting forever for the parent's output lock. Anywhere else, nothing."""
    note = os.environ.get(NOTE_ENV)
    if not note or not _importing_main():
        return
    try:
        with open(note, "w", encoding="utf-8") as f:
            f.write(NO_MAIN_GUARD)
    except OSError:
        print(f"profparse: error: {NO_MAIN_GUARD}", file=sys.stderr, flush=True)
    raise SystemExit(2)


@contextlib.contextmanager
def _guard_note() -> Iterator[str]:
    """A path for :func:`refuse_in_pool_import`'s note, in the environment the pool's processes start with."""
    fd, note = tempfile.mkstemp(prefix="profparse-pool-", suffix=".note")
    os.close(fd)
    os.unlink(note)
    previous = os.environ.get(NOTE_ENV)
    os.environ[NOTE_ENV] = note
    try:
        yield note
    finally:
        if previous is None:
            os.environ.pop(NOTE_ENV, None)
        else:
            os.environ[NOTE_ENV] = previous
        with contextlib.suppress(OSError):
            os.unlink(note)


def _raise_if_unguarded(note: str) -> None:
    if os.path.exists(note):
        raise UsageError(NO_MAIN_GUARD)


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the pool starts (forkserver, workers, submits) and deliver them right after,
    where the pool can be stopped cleanly. A signal in the first second otherwise broke off a worker's start
    half-way: the worker, unknown to the pool, then printed a traceback (Ctrl-C), or failed to find the pool's
    semaphores once the parent had let go of them (SIGTERM), or it reached the forkserver
    (:func:`_start_forkserver`).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    for signum in dict.fromkeys(caught):  # each once, in order: its own handler now raises (or ends the process)
        signal.raise_signal(signum)


def _start_forkserver() -> None:
    """Start the forkserver ignoring Ctrl-C, a setting it inherits: it imports profparse before it sets its own
    handlers, so a Ctrl-C then printed a traceback from it."""
    import signal
    import threading
    from multiprocessing import forkserver, resource_tracker

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    resource_tracker.ensure_running()  # first: it unblocks Ctrl-C itself after starting, which would drop one below
    # held as well as ignored here: Linux keeps a held signal pending even while it is ignored, so a Ctrl-C in
    # this window reaches the handler put back below instead of being lost
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _own_multiprocessing_temp_dir() -> Iterator[None]:
    """Remove, when the pool is done, the ``pymp-*`` folder multiprocessing creates in ``$TMPDIR`` for the
    forkserver's socket, and let go of the forkserver that listens there (the next pool starts a new one).

    multiprocessing removes that folder in its exit function, which the CLI does not run (it ends with
    ``os._exit``), so every ``-j N`` run left one behind. Only a folder (and a forkserver) this pool started is
    touched: one that was there before belongs to the caller's own use of multiprocessing and stays.
    """
    from multiprocessing import forkserver, process, util

    config = process.current_process()._config
    folder_before = config.get("tempdir")
    if folder_before is None:
        config["tempdir"] = _short_temp_dir()  # None: multiprocessing makes its own in $TMPDIR
    server = getattr(forkserver, "_forkserver", None)
    server_before = getattr(server, "_forkserver_pid", None)
    try:
        yield
    finally:
        folder = config.get("tempdir")
        ours = folder_before is None and folder is not None
        if ours and server_before is None and getattr(server, "_forkserver_pid", None) is not None:
            ours = _let_go_of_forkserver(server)
        if ours:
            shutil.rmtree(folder, ignore_errors=True)
            config["tempdir"] = None
            for finalizer in list(getattr(util, "_finalizer_registry", {}).values()):
                if folder in (getattr(finalizer, "_args", None) or ()):
                    finalizer.cancel()  # it would remove the folder again at exit, and print a traceback


# the forkserver listens on TEMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX: an AF_UNIX path, at most 107 bytes on Linux
_SOCKET_NAME_BYTES = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
_SOCKET_PATH_MAX = 107


def _short_temp_dir() -> str | None:
    """A ``pymp-*`` folder of our own in the first of /tmp, /var/tmp where ``$TMPDIR`` is too long for the
    forkserver's socket path (the pool failed with 'AF_UNIX path too long'), else None (multiprocessing's own)."""
    import tempfile

    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_NAME_BYTES <= _SOCKET_PATH_MAX:
        return None
    for base in ("/tmp", "/var/tmp"):
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            return tempfile.mkdtemp(prefix="pymp-", dir=base)
    return None


def _let_go_of_forkserver(server: Any) -> bool:
    """Tell the forkserver to stop (it exits once the last of its workers has) and forget it; False where this
    Python's forkserver does not look as expected (it is then left running, with its socket).

    Unlike ``ForkServer._stop`` this does not wait for it: its exit is slow (the interpreter's shutdown with
    pandas loaded), and a worker that a signal caught half-started, unknown to the pool and so not killed, keeps
    it alive until this process ends. A daemon thread reaps it whenever it ends."""
    import threading

    try:
        with server._lock:
            pid, alive_fd = server._forkserver_pid, server._forkserver_alive_fd
            server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
    except AttributeError:
        return False
    with contextlib.suppress(OSError):
        os.close(alive_fd)  # the forkserver's signal to stop
    threading.Thread(target=_reap, args=(pid,), name="profparse-forkserver-reaper", daemon=True).start()
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)


def _stop(pool: Any) -> None:
    """Shut a process pool down at once: pending ranks cancelled, running workers killed."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # no public way to reach them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.kill()
    for process in workers:
        process.join(5)


def run_local(
    tasks: list[RankTask],
    jobs: int,
    on_done: Callable[[RankResult], None],
    fn: Callable[[RankTask], RankResult] = run_rank,
) -> list[RankResult]:
    if jobs <= 1 or len(tasks) <= 1:
        results = []
        for task in tasks:
            results.append(fn(task))
            on_done(results[-1])
        return results
    with _own_multiprocessing_temp_dir(), _guard_note() as note:
        return _run_pool(tasks, jobs, on_done, fn, note)


def _run_pool(
    tasks: list[RankTask],
    jobs: int,
    on_done: Callable[[RankResult], None],
    fn: Callable[[RankTask], RankResult],
    note: str = "",
) -> list[RankResult]:
    """The tasks in a pool of ``jobs`` forkserver processes (see :func:`run_local`); a script that calls
    ``parse_ranks`` when imported is a UsageError (its workers, importing it, leave ``note``)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # forkserver: workers start from a clean process (no inherited threads), with profparse imported once
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["profparse.ranks", "profparse.api", "profparse.outputs.parquet"])
    results: dict[int, RankResult] = {}
    broken: list[int] = []
    start = {"mp_context": context, "initializer": _worker_start, "initargs": (os.getpid(), dict(os.environ))}
    pool = None
    try:
        with _ctrl_c_held():
            _start_forkserver()
            pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), **start)
            futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            i = futures[future]
            try:
                results[i] = future.result()
            except BrokenProcessPool:
                broken.append(i)
                continue
            except Exception as exc:  # noqa: BLE001
                results[i] = _failed(tasks[i], f"{tasks[i].path}: {type(exc).__name__}: {exc}")
            on_done(results[i])
    except BaseException:  # Ctrl-C or an error here: stop the workers now rather than wait for their ranks
        if pool is not None:
            _stop(pool)
        _raise_if_unguarded(note)
        raise
    pool.shutdown()
    if broken:
        _raise_if_unguarded(note)
    # A dead worker takes the pool down with every rank it still held: run those again one by one, each in its own
    # process, so that only a rank that kills its process again fails.
    for i in sorted(broken):
        with ProcessPoolExecutor(max_workers=1, **start) as solo:
            try:
                results[i] = solo.submit(fn, tasks[i]).result()
            except BrokenProcessPool:
                results[i] = _failed(tasks[i], f"{tasks[i].path}: {DIED}", 8)
            except Exception as exc:  # noqa: BLE001
                results[i] = _failed(tasks[i], f"{tasks[i].path}: {type(exc).__name__}: {exc}")
        on_done(results[i])
    return [results[i] for i in range(len(tasks))]


def _run_dask(tasks: list[RankTask], scheduler: str, on_done: Callable[[RankResult], None]) -> list[RankResult]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise UsageError(
            f"--scheduler needs dask.distributed: {install_hint('dask')} (here and on the workers)"
        ) from None
    try:
        client = Client(scheduler, timeout="20s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ProfparseError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    results: dict[int, RankResult] = {}
    try:
        run_id = uuid.uuid4().hex[:12]
        keys = [f"profparse-rank-{t.rank}-{run_id}" for t in tasks]
        futures = client.map(run_rank, tasks, pure=False, retries=0, key=keys)
        index = {f.key: i for i, f in enumerate(futures)}
        for future in as_completed(futures, loop=client.loop):
            i = index[future.key]
            try:
                results[i] = future.result()
            except Exception as exc:  # noqa: BLE001 - a lost worker fails its rank only
                results[i] = _failed(tasks[i], f"{tasks[i].path}: Dask task failed: {type(exc).__name__}: {exc}")
            on_done(results[i])
    finally:
        client.close()
    return [results[i] for i in range(len(tasks))]


def run_tasks(
    tasks: list[RankTask],
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    on_done: Callable[[RankResult], None] | None = None,
) -> list[RankResult]:
    """Run one :func:`run_rank` per task: on the Dask ``scheduler`` if given, else ``jobs`` local processes."""
    on_done = on_done or (lambda result: None)
    if scheduler:
        return _run_dask(tasks, scheduler, on_done)
    jobs, _ = local_workers(jobs, len(tasks))
    return run_local(tasks, jobs, on_done)


FORCE_JOBS_ENV = "PROFPARSE_FORCE_JOBS"


def local_workers(jobs: int | None, tasks: int) -> tuple[int, str | None]:
    """Worker processes for ``tasks`` rank tasks, and a note when ``jobs`` was lowered.

    ``jobs`` (default: one per usable CPU), at most one per task, and at most one per usable CPU: each worker
    parses a whole rank, so more of them only share the CPUs and add up their memory. ``$PROFPARSE_FORCE_JOBS=1``
    lifts the CPU bound (a run whose ranks wait on a slow disk, say)."""
    from profparse.trace.workers import usable_cpus  # the decoder's own bound on its workers

    cpus = usable_cpus()
    if jobs is None:
        return max(1, min(cpus, tasks)), None
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1 (got {jobs})")
    wanted = max(1, min(jobs, tasks))
    forced = os.environ.get(FORCE_JOBS_ENV, "").strip().lower() in ("1", "true", "yes")
    if wanted > cpus and not forced:
        cpu_word = "CPU" if cpus == 1 else "CPUs"
        return cpus, f"-j {jobs} lowered to the {cpus} {cpu_word} this process may use; {FORCE_JOBS_ENV}=1 keeps it"
    return wanted, None
