"""A run's records and where they go: its directory on disk (directory.py: weights, config,
tokenizer, finding and loading runs), results.json (results.py: what ran and what it measured,
and how a record was measured), what is logged (tensorboard_log.py: TensorBoard's tags, the
evaluation's curves and figures), where it goes (loggers/: ``logger=``) and a sweep's last lines
(sweep_summary.py)."""
