"""Shell snippets, each leaving a process that tries to outlive its command.

Each leaves one that ignores SIGTERM and has let go of the output pipes, so
that only the run's tracking can end it (``hand/reaper.py``). The python
daemon and the slow second fork make their last fork while the command is
exiting, which is when the end-of-run sweep looks for them. Put a snippet
before the command's last words (``... exit 0``).
"""

from __future__ import annotations

import sys

PY_DAEMON = (
    "import os, signal, time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "fd = os.open(os.devnull, os.O_RDWR)\n"
    "[os.dup2(fd, n) for n in (0, 1, 2)]\n"
    "time.sleep(1000)\n"
)
QUIET = "</dev/null >/dev/null 2>&1"
ESCAPES = {
    "setsid": f"setsid sh -c 'trap \"\" TERM; exec sleep 1000' {QUIET} & ",
    "double_fork_setsid": f"(setsid sh -c 'trap \"\" TERM; exec sleep 1000' {QUIET} &); ",
    "nohup": f"nohup sh -c 'trap \"\" TERM; exec sleep 1000' {QUIET} & ",
    "python_daemon": f"{sys.executable} -I -S -c '{PY_DAEMON}'; ",
    # The daemon's own child is forked when the command writes the FIFO,
    # right before it exits: the second fork races the command's end.
    "slow_second_fork": (
        'f="$(mktemp -u)"; mkfifo "$f"; '
        f"(setsid sh -c 'trap \"\" TERM; read go < \"$0\"; "
        f"(trap \"\" TERM; exec sleep 1000) {QUIET} & exit' \"$f\" {QUIET} &); "
        'echo go > "$f"; rm -f "$f"; '
    ),
}
