"""Numeric and symbolic audit of every recorded derivation step."""
from .runner import AuditError, AuditReport, StepResult, audit, fd_tangents

__all__ = ["AuditError", "AuditReport", "StepResult", "audit", "fd_tangents"]
