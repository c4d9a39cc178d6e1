"""``Status``: the answer of every ``can_implement`` predicate (truthy when implementable)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Status:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @staticmethod
    def success() -> "Status":
        return Status(True, "")

    @staticmethod
    def fail(reason: str) -> "Status":
        return Status(False, reason)

    def raise_if_failed(self, what: str = "config") -> None:
        if not self.ok:
            raise ValueError(f"nvgemm_cutedsl: {what} cannot be implemented: {self.reason}")
