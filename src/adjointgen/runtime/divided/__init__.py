"""Scalar functions as programs over primitives, and their divided differences.

* :mod:`.program`: the data (:class:`ScalarProgram`), built by :mod:`adjointgen.codegen.scalar`;
* :mod:`.primitives`: each primitive's values, stable first and second divided differences, domains;
* :mod:`.evaluate`: ``f``, ``f[a, b]``, ``f[a, b, c]`` of a whole program by the chain and Leibniz
  rules, and the domain checks that name the offending eigenvalue;
* :mod:`.arrays`: the same code on torch, NumPy and CuPy arrays.
"""
from .evaluate import AccuracyWarning, check_domain, first, second, values
from .program import Op, ScalarProgram

__all__ = ["AccuracyWarning", "Op", "ScalarProgram", "check_domain", "first", "second", "values"]
