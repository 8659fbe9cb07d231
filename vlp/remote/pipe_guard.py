"""The guard of a ``pipe:`` command: run as a script, never imported by vlp (it imports nothing of it)::

    python -S -I pipe_guard.py PARENT_PID COMMAND

:func:`vlp.remote.shard_urls.open_url` starts it in a session of its own, so the guard leads a process
group that holds every process of COMMAND (run by ``/bin/sh -c`` with the guard's standard streams:
its output is the reader's pipe). The guard exits with COMMAND's status, or dies of the signal that
ended it. The group dies whole:

- when the reader kills it (a deadline, a reader that stopped early): ``killpg`` from the reader;
- when its parent dies however it dies, SIGKILL included (the stop watchdog kills loader workers
  so): Linux sends the guard SIGHUP then (``PR_SET_PDEATHSIG``), on which it kills its group,
  itself included. Elsewhere than on Linux this case is not covered.

SIGTERM and SIGINT keep the dispositions the guard inherited, and so does COMMAND: in a training
loader's worker they are ignored (a scheduler's SIGTERM reaches every process of the job, and the
run reads on to its checkpoint at the next step), as they were for a command started there directly.
"""

import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # prctl(2)


def kill_group(_signum: object = None, _frame: object = None) -> None:
    """Kill the guard's process group with SIGKILL: the command's every process and the guard."""
    os.killpg(0, signal.SIGKILL)


def die_with(parent: int) -> None:
    """Kill the group when the parent dies: be sent SIGHUP then (Linux), or now if it has died already."""
    signal.signal(signal.SIGHUP, kill_group)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGHUP)
    if os.getppid() != parent:
        kill_group()


def main() -> None:
    """Run the command of ``sys.argv`` under the guard (module doc)."""
    parent, command = int(sys.argv[1]), sys.argv[2]
    die_with(parent)
    status = subprocess.Popen(["/bin/sh", "-c", command]).wait()
    if status < 0:  # ended by a signal: end by the same one, as the shell's parent would have seen
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
