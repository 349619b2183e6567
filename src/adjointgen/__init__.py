"""adjointgen: derived, audited JVP/VJP rules for matrix decompositions."""
