"""Signal handlers installed for the duration of a block, and the previous ones put back; the
training loop's stop requests (SIGINT, SIGTERM) among them."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Handler = Callable[[int, Any], Any]


@contextmanager
def handling(signals: Sequence[int], handler: Handler) -> Iterator[dict[int, Any]]:
    """While active, ``handler`` receives ``signals``; yields the handlers it replaced, which
    are restored on exit. Off the main thread nothing changes (Python delivers signals to the
    main thread only, and only it may install handlers) and the mapping is empty."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield previous
    finally:
        restore(previous)


def restore(handlers: dict[int, Any]) -> None:
    """Put back the ``handlers`` that ``handling`` replaced."""
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


@dataclass
class StopRequest:
    signum: int | None = None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """While active, SIGINT (Ctrl-C) and SIGTERM (e.g. SLURM pre-emption) only record that a
    stop was asked for, so the loop can finish its step and checkpoint first. A second signal
    of the same kind acts at once (its previous handler is back): an impatient user is never
    stuck, and the atomic checkpoint write keeps the last complete checkpoint intact either
    way. The other kind is still only recorded: Ctrl-C under torchrun reaches the ranks both
    as SIGINT and, from torchrun, as SIGTERM, and must still checkpoint."""
    request = StopRequest()

    def handle(signum: int, frame: object) -> None:
        request.signum = request.signum or signum
        restore({signum: previous[signum]})

    with handling(STOP_SIGNALS, handle) as previous:
        yield request
