# JAX's own test modules, vendored as data for tests/jax_upstream.py: not collected by pytest here
# (they run, with adjointgen.jax swapped in or not, through tests/test_jax_upstream.py).
collect_ignore = ["linalg_test.py", "eigh_test.py"]
