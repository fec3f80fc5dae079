"""Child processes that do not outlive the process that started them.

`die_with_parent` asks the kernel (Linux `prctl(PR_SET_PDEATHSIG)`) to send SIGTERM to the
calling process when its parent dies, even by SIGKILL. Pass it as `preexec_fn` to
`subprocess.Popen`, or call it first thing in a forked worker. Elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal

#: prctl(2) option: the signal the calling process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies, even by SIGKILL (Linux; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
