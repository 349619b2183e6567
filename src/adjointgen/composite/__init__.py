"""Operations composed from generated rules and runtime solvers.

``eigsh`` (partial symmetric and generalized eigenproblems), ``svds`` (partial SVD) and the full
SVD's complement basis combine the autograd Functions of :mod:`adjointgen.generated.torch` with the
solvers, checks and gauge handling of :mod:`adjointgen.runtime`.  They sit above both: the runtime
never imports generated code (the generated code imports the runtime), so the import graph has no
cycle.  The public functions are :mod:`adjointgen.torch`'s; ``jax_eigsh`` is ``agj.eigsh``'s
(imported by :mod:`adjointgen.jax` only, so the torch side never imports JAX).
"""
