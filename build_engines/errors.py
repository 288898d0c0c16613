"""Errors that carry their own exit code, so every command fails the same way for the same cause.

Exit codes: 0 ok, 1 other failure (missing artefact, I/O), 2 bad spec (including a model that cannot be
exported as the spec describes it), 3 verify failed, 4 cannot run on this machine.
"""

from __future__ import annotations


class BuildEnginesError(Exception):
    exit_code = 1


class SpecError(BuildEnginesError):
    """One or more spec fields are wrong; every message starts with the dotted field path to fix."""

    exit_code = 2

    def __init__(self, spec_path: object, problems: list[tuple[str, str]]) -> None:
        self.spec_path = str(spec_path)
        self.problems = problems
        self.fields = [field for field, _ in problems]
        lines = [f"{self.spec_path}: {field}: {message}" for field, message in problems]
        super().__init__("\n".join(lines))


class VerifyFailed(BuildEnginesError):
    exit_code = 3


class CannotRunHere(BuildEnginesError):
    exit_code = 4


class MissingArtefact(BuildEnginesError):
    exit_code = 1
