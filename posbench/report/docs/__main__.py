"""``python -m posbench.report.docs``: render README's and docs/'s results from results/."""

from posbench.report.docs import main

if __name__ == "__main__":
    main()
