"""Signal handlers installed for the duration of a block, and the previous ones put back."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
