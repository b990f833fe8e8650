"""The one exception type users see: its message is a single line that says how to fix it."""


class PosbenchError(Exception):
    """A problem the user can fix (bad config, missing run, empty corpus, ...).

    The CLI prints ``error: <message>`` on one line and exits non-zero; internal invariants
    use ``assert`` instead, so a traceback always means a posbench bug.
    """
