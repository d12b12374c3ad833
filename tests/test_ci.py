"""CI runs what the README tells a newcomer to run, in a virtual environment of its own."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_commands_in_a_fresh_venv():
    readme_line = next(line for line in (ROOT / "README.md").read_text().splitlines()
                       if '".[test]"' in line and "pytest" in line)
    commands = [c.strip() for c in readme_line.split("#")[0].split("&&")]
    assert commands == ['pip install -e ".[test]"', "python -m pytest"]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    # Each command as a line of its own, word for word (`|| exit 1` may follow).
    runs = [next((i for i, line in enumerate(ci_lines)
                  if line == command or line.startswith(command + " ||")), None)
            for command in commands]
    assert None not in runs, f".ci/run does not run the README's {commands}"
    venv = next(i for i, line in enumerate(ci_lines) if line.startswith("python3 -m venv "))
    activate = ci_lines.index('source "$venv/bin/activate" || exit 1')
    assert venv < activate < runs[0] < runs[1]
