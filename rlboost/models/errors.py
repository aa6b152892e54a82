"""What making a model ready refuses, in one place below the modules that raise it (the factory, the tiny model,
the fetcher): `ModelError` for `ensure_model`'s callers, and `ModelFetchError` for the fetcher's command line,
which names the spec.model field at fault, one reason word, and an exit code that says whose problem it is."""

from __future__ import annotations

EXIT_USAGE, EXIT_BAD_SOURCE, EXIT_UNREACHABLE = 2, 3, 4
NOT_FOUND, UNAUTHORIZED, UNREACHABLE, INVALID_MODEL, UNSUPPORTED = (
    "NotFound",
    "Unauthorized",
    "Unreachable",
    "InvalidModel",
    "Unsupported",
)


class ModelError(ValueError):
    """A model directory that cannot be used or created; the message names the spec field and the fix."""


class ModelFetchError(Exception):
    """The model cannot be made ready; `field` is the spec.model field at fault, `reason` one word (NotFound,
    Unauthorized, Unreachable, InvalidModel, Unsupported)."""

    def __init__(self, field: str, reason: str, detail: str) -> None:
        super().__init__(f"spec.model.{field}: {reason}: {detail}")
        self.field, self.reason, self.detail = field, reason, detail

    @property
    def exit_code(self) -> int:
        return EXIT_UNREACHABLE if self.reason == UNREACHABLE else EXIT_BAD_SOURCE
