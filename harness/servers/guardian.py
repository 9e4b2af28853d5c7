"""The watchdog process (`python -m harness.servers.guardian PARENT_PID`): kills our server groups if
replaybench itself dies, even by SIGKILL.

Signal handlers and atexit cannot run when replaybench is SIGKILLed, and PR_SET_PDEATHSIG only reaches a
server's first process, not the workers it forks. So replaybench starts one watchdog (in its own session,
so Ctrl-C does not reach it) and tells it over a pipe which process groups are live ("add PGID" /
"del PGID"). When the pipe closes or its parent disappears, the watchdog terminates every group still
registered, then exits. It imports only the standard library and `groups`, so it starts fast.
"""

from __future__ import annotations

import os
import select
import sys

from harness.servers.groups import terminate_group

WATCHDOG_GRACE_S = 5.0
_POLL_S = 0.5


def _serve(parent_pid: int) -> None:
    """Track groups from stdin until EOF or the parent's death, then terminate the ones left."""
    live: set[int] = set()
    stdin = sys.stdin.fileno()
    buffer = b""
    while True:
        ready, _, _ = select.select([stdin], [], [], _POLL_S)
        if not ready:
            # Lines already written are always read first, so a parent that dies right after registering
            # a group still gets it cleaned up.
            if os.getppid() != parent_pid:
                break
            continue
        chunk = os.read(stdin, 4096)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            verb, _, pgid = line.decode().partition(" ")
            if verb == "add":
                live.add(int(pgid))
            elif verb == "del":
                live.discard(int(pgid))
    for pgid in live:
        terminate_group(pgid, WATCHDOG_GRACE_S)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
