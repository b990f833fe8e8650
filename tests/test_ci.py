"""CI (.ci/run) runs README's first code block line by line, as README writes it."""

import shutil
import subprocess
from pathlib import Path

from test_docs import BLOCK, README

CI = README.parent / ".ci" / "run"


def ci_with_readme(root: Path, first_block: str) -> Path:
    """A copy of .ci/run in ``root``, beside a README.md whose first code block is
    ``first_block``."""
    (root / ".ci").mkdir()
    shutil.copy(CI, root / ".ci" / "run")
    later_block = "```bash\nls\n```\n"
    (root / "README.md").write_text(f"# posbench\n\n```bash\n{first_block}```\n\n{later_block}")
    return root / ".ci" / "run"


def ci(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=300)


def test_ci_runs_exactly_the_commands_of_readmes_first_code_block():
    printed = ci(CI, "--print")
    assert printed.returncode == 0, printed.stderr
    first_block = next(BLOCK.finditer(README.read_text()))
    assert printed.stdout.splitlines() == first_block["code"].splitlines()


def test_ci_refuses_a_readme_whose_first_block_runs_no_tests(tmp_path):
    result = ci(ci_with_readme(tmp_path, 'pip install -e ".[dev]"\n'), "--print")
    assert result.returncode != 0
    assert result.stderr.strip() == (
        "error: README's first code block runs no tests (no pytest command)"
    )


def test_a_command_that_exits_5_as_pytest_does_when_it_collects_nothing_fails_ci(tmp_path):
    block = 'echo ran\npython -c "raise SystemExit(5)"  # python -m pytest -q, no test found\n'
    result = ci(ci_with_readme(tmp_path, block))
    assert result.returncode == 5
    assert "ran" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("error: README's command exited 5")
