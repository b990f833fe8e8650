"""The ``posbench`` commands, one module each; posbench/cli.py dispatches to their ``run_*``.

train.py     ``posbench train``: Hydra composes conf/, each job trains and evaluates one run
eval.py      ``posbench eval``: re-evaluate a trained run at other lengths
report.py    ``posbench report``: compare the runs of a sweep
diagnose.py  ``posbench diagnose``: attention statistics by query position

Below them, what they share:

overrides.py  train's Hydra overrides checked before any job starts, each mistake one line
arguments.py  argparse with one-line errors, the numeric flag types, ``--run DIR``
exits.py      one error line and the exit code a shell expects (2, 130 for Ctrl-C, 143 for
              SIGTERM), for every command
"""
