"""``python -m posbench``: the ``posbench`` command, e.g. under
``torchrun --standalone --nproc_per_node=N -m posbench train ...``."""

from posbench.cli import main

if __name__ == "__main__":
    main()
