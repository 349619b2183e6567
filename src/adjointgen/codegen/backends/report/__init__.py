"""The report backend: each operation's audit as markdown (``report/audit.md.j2``)."""
from __future__ import annotations

from .. import Backend

BACKEND = Backend("report", "report/audit.md.j2", None, None)
