"""The derivation builder's steps, one module per family; :class:`adjointgen.calculus.derivation.Derivation`
combines them."""
