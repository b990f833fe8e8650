"""What posbench needs of the machine and the file system, below everything else: atomic writes
(atomic.py), the cache's root (cache_root.py), the cores free (cpu_load.py), the posbench jobs
running (job_registry.py), threads per job (threads.py), signals (signals.py), unique run
directories (output_dirs.py), bf16 or fp32 (precision.py), dynamo's recompile limits
(dynamo.py), data-parallel ranks (distributed.py), the code a run ran (versions.py) and where,
when and by which command it ran (machine.py). Nothing here imports posbench's other parts,
errors.py aside."""
