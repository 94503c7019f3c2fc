"""The one error hierarchy. Anything a user can cause or fix is a CloudtrainError.

The CLI prints `str(error)` (plus `hint` when set) on one line and exits non-zero, with no
traceback. Adapters translate SDK exceptions into these types; nothing above `providers/` catches
SDK exceptions.
"""

from __future__ import annotations


class CloudtrainError(Exception):
    """Base of every error the user should see as one clear line.

    `hint` says what to do next; `exit_code` is what the CLI exits with.
    """

    exit_code: int = 1

    def __init__(
        self, message: str, *, hint: str | None = None, codes: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # the cloud's own error codes/reasons (and HTTP status, as text) this error was made
        # from, so a caller can tell one cloud condition from another without the SDK
        self.codes = codes

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class SpecError(CloudtrainError):
    """The job spec is invalid. The message names file:line and the field path."""

    exit_code = 2


class PlanError(CloudtrainError):
    """No feasible or affordable plan for the spec (nothing was created)."""

    exit_code = 2


class UsageError(CloudtrainError):
    """A bad invocation: an unknown run id, a missing provider extra, a bad option."""

    exit_code = 2


class LedgerError(CloudtrainError):
    """The local ledger cannot be read or written."""


class ProviderError(CloudtrainError):
    """A cloud call failed. The message names the resource and what to do next."""

    retryable: bool = False


class NotTheRuns(ProviderError):
    """A delete by name refused: the resource does not carry the run's tag or name pattern (a
    name from a forged or stale record). `refused` holds each (kind, id); the run's other
    resources in the same call were deleted."""

    def __init__(self, message: str, *, refused: tuple[tuple[str, str], ...]) -> None:
        super().__init__(message, codes=frozenset({"NotTheRuns"}))
        self.refused = refused


class CredentialsError(ProviderError):
    """The SDK's credential chain found nothing usable."""


class RightsMissing(CredentialsError):
    """The caller's credentials lack rights a run needs (asked of the cloud before anything is
    created: cloudtrain/plan/account_check.py). `missing` holds the rights, as the cloud names
    them."""

    def __init__(self, message: str, *, hint: str | None = None, missing: tuple[str, ...]) -> None:
        super().__init__(message, hint=hint, codes=frozenset({"RightsMissing"}))
        self.missing = missing


class NoCapacityError(ProviderError):
    """The zone has no capacity for the instance type; another zone may."""

    def __init__(
        self,
        message: str,
        *,
        zone: str | None = None,
        hint: str | None = None,
        codes: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(message, hint=hint, codes=codes)
        self.zone = zone


class QuotaError(ProviderError):
    """An account quota blocks the create; the message names the quota to raise."""


class NotFound(ProviderError):
    """The resource does not exist (deletes treat this as success)."""


class TransientError(ProviderError):
    """Throttling or a 5xx; safe to retry with backoff."""

    retryable = True


class AlreadyExists(ProviderError):
    """The resource already exists (a 409 / ALREADY_EXISTS): a create that is idempotent by name
    treats this as success and reads the existing resource."""


class PreconditionFailed(ProviderError):
    """A conditional write lost: the object changed (or exists, or is gone) since it was read.
    Never retried: the caller reads again and decides."""


class TooLarge(ProviderError):
    """An object holds more than the bounded read asked for (`get(key, max_bytes=n)`): the
    reader took at most n + 1 bytes of it and skips it. Never retried: it will not shrink.
    From `get_tagged`, `tag` is the object's version tag, so a conditional write can still
    replace it (cloudtrain/state/lease.py: a huge lease a node forged)."""

    tag: str | None = None


class LeaseError(CloudtrainError):
    """The run's control lease (cloudtrain/state/lease.py)."""


class LeaseHeld(LeaseError):
    """Another live owner holds the run's lease; the message names it and its expiry."""


class LeaseLost(LeaseError):
    """This process no longer holds the lease (expired, taken over): it must stop acting now."""
