"""What a derivation declares about its symbols (symmetric, diagonal, skew, triangular,
orthonormal, clustered): :class:`Structure`, consulted by the rewrite rules."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Structure:
    """Properties a derivation declares for its symbols, consulted by the rewrite rules.

    With ``complex`` set, symbols hold complex matrices and ``X^T`` (``Transpose``) is read as the
    conjugate transpose ``X^H``: "symmetric" means Hermitian, "skew" anti-Hermitian, ``sym``/``skew``
    are the Hermitian/anti-Hermitian parts, and scalar coefficients stay real.  Rules that hold only
    for real matrices (``diag(X^T) = diag(X)``, the zero diagonal of a skew matrix) are then off.
    Diagonal symbols are real in both fields; a symbol declared both diagonal and skew is an
    anti-Hermitian (imaginary) diagonal.
    """

    symmetric: set[str] = field(default_factory=set)
    diagonal: set[str] = field(default_factory=set)
    skew: set[str] = field(default_factory=set)
    #: name -> name of the matrix M with ``X^T M X = I`` (``None`` for ``M = I``)
    orthonormal: dict[str, str | None] = field(default_factory=dict)
    complex: bool = False
    #: gauge parameter -> the cluster indicator ``K`` it is supported on (``Ω = K ∘ Ω``)
    clustered: dict[str, str] = field(default_factory=dict)
    #: lower / upper triangular symbols; ``unit``: unit diagonal, ``strict``: zero diagonal
    lower: set[str] = field(default_factory=set)
    upper: set[str] = field(default_factory=set)
    unit: set[str] = field(default_factory=set)
    strict: set[str] = field(default_factory=set)
    #: triangular symbols whose diagonal is real (complex derivations: the Cholesky factor, whose
    #: diagonal is positive, and its tangent)
    real_diagonal: set[str] = field(default_factory=set)
    #: diagonal symbols whose entries are complex (the eigenvalues of a general matrix): not
    #: Hermitian, ``D^H = conj(D)``, still commuting with every diagonal
    complex_diagonal: set[str] = field(default_factory=set)

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError(f"a frozen Structure cannot change ({name})")
        object.__setattr__(self, name, value)

    def frozen(self) -> "Structure":
        """An immutable copy (frozensets, read-only mappings): the structure of a finished spec."""
        import types

        copy = Structure(frozenset(self.symmetric), frozenset(self.diagonal), frozenset(self.skew),
                         types.MappingProxyType(dict(self.orthonormal)), self.complex,
                         types.MappingProxyType(dict(self.clustered)), frozenset(self.lower), frozenset(self.upper),
                         frozenset(self.unit), frozenset(self.strict), frozenset(self.real_diagonal),
                         frozenset(self.complex_diagonal))
        object.__setattr__(copy, "_frozen", True)
        return copy

    def is_symmetric(self, name: str) -> bool:
        return ((name in self.symmetric or name in self.diagonal) and name not in self.skew
                and name not in self.complex_diagonal)

    def real(self) -> "Structure":
        """The same declarations for real matrices (the specialisation of a complex rule)."""
        return Structure(set(self.symmetric), set(self.diagonal), set(self.skew), dict(self.orthonormal), False,
                         dict(self.clustered), set(self.lower), set(self.upper), set(self.unit), set(self.strict),
                         set(self.real_diagonal), set(self.complex_diagonal))

    def triangle(self, name: str) -> tuple[str, str] | None:
        """``(side, diagonal)`` of a triangular symbol: side ``lower``/``upper``, diagonal
        ``unit``/``zero``/``general``; ``None`` if the symbol is not declared triangular."""
        side = "lower" if name in self.lower else ("upper" if name in self.upper else None)
        if side is None:
            return None
        return side, ("unit" if name in self.unit else ("zero" if name in self.strict else "general"))

    def describe(self, name: str) -> list[str]:
        props = []
        if name in self.complex_diagonal:
            props.append("complex diagonal")
        elif name in self.diagonal:
            props.append("diagonal")
        elif name in self.symmetric:
            props.append("symmetric")
        if name in self.skew:
            props.append("skew-symmetric")
        tri = self.triangle(name)
        if tri is not None:
            side, diag = tri
            props.append({"unit": f"unit {side} triangular", "zero": f"strictly {side} triangular"}.get(diag, f"{side} triangular"))
        if name in self.orthonormal:
            m = self.orthonormal[name]
            props.append("orthonormal columns" if m is None else f"{m}-orthonormal columns")
        return props
