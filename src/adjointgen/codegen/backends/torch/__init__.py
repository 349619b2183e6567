"""The torch backend: autograd functions, checked public functions and the rules, as torch
operations (``torch/op.py.j2``; runtime: :mod:`adjointgen.runtime`)."""
from __future__ import annotations

from ...printers import ArrayPrinter
from ...verify import verify_torch_module
from .. import Backend

#: the torch backend's runtime modules, each under ``_<module>``
_TORCH_RUNTIME = ("linalg", "solvers", "checks", "function", "host", "dispatch", "degeneracy", "pairwise", "divided",
                  "spectral")
PRINTER = ArrayPrinter(
    "torch",
    {
        "matmul": "{0} @ {1}",
        "transpose": "{0}.mT",
        "add": None,
        "scale": "{coeff} * {0}",
        # at a cluster, a second derivative moves the values of v(d) as a block (runtime.value_blocks);
        # add_diag: one copy of the matrix with the diagonal replaced, no n x n diagonal matrix formed
        "add_diag": "_pairwise.add_diag({0}, {1})",
        "scale_rows": "_pairwise.scale_rows({0}, {1})",
        "scale_cols": "_pairwise.scale_cols({0}, {1})",
        "diag_mul": "{0} * {1}",
        "diagonal": "{0}.diagonal(dim1=-2, dim2=-1)",
        "diag_matmul": "({0}.mT * {1}).sum(-2)",
        "reciprocal": "{0}.reciprocal()",
        "reciprocal_masked": "_degeneracy.reciprocal({0}, cluster_rtol)",
        "skew": "0.5 * ({0} - {0}.mT)",
        "sym": "0.5 * ({0} + {0}.mT)",
        "pairwise_mul": "{fn}_times({0}, {1}, 1{options})",
        "hadamard": "{0} * {1}",
        "pairwise_mul_skew": "{fn}_times({0}, {1} - {1}.mT, 0.5{options})",
        "pairwise_mul_sym": "{fn}_times({0}, {1} + {1}.mT, 0.5{options})",
        "shifted_solve": "_solvers.shifted_solve({0}, {1}, {2}, {3}, {4})",
        "sylvester_solve": "_linalg.sylvester({0}, {1}, {2}, hermitian={hermitian})",
        "add_eye": "{0} + {coeff} * torch.eye({0}.shape[-1], dtype={0}.dtype, device={0}.device)",
        "lower_half": "_linalg.lower_half({0})",
        "strictly_lower": "{0}.tril(-1)",
        "solve_unit_lower": "torch.linalg.solve_triangular({0}, {1}, upper=False, unitriangular=True)",
        "solve_unit_upper": "torch.linalg.solve_triangular({0}, {1}, upper=True, unitriangular=True)",
        "solve_right_unit_lower": "torch.linalg.solve_triangular({1}, {0}, upper=False, left=False, unitriangular=True)",
        "solve_right_unit_upper": "torch.linalg.solve_triangular({1}, {0}, upper=True, left=False, unitriangular=True)",
        "inverse_unit_lower": "torch.linalg.inv({0})",
        "inverse_unit_upper": "torch.linalg.inv({0})",
        "solve_lu": "_linalg.lu_solve({0}, {1}, {2}, {3}, adjoint={adjoint})",
        "solve_right_lu": "_linalg.lu_solve({1}, {2}, {3}, {0}, adjoint={adjoint}, left=False)",
        "solve_general": "torch.linalg.solve({0}, {1})",
        "solve_lower": "torch.linalg.solve_triangular({0}, {1}, upper=False)",
        "solve_upper": "torch.linalg.solve_triangular({0}, {1}, upper=True)",
        "solve_right_general": "torch.linalg.solve({1}, {0}, left=False)",
        "solve_right_lower": "torch.linalg.solve_triangular({1}, {0}, upper=False, left=False)",
        "solve_right_upper": "torch.linalg.solve_triangular({1}, {0}, upper=True, left=False)",
        "inverse_general": "torch.linalg.inv({0})",
        "inverse_lower": "torch.linalg.inv({0})",
        "inverse_upper": "torch.linalg.inv({0})",
        "inverse_lu": "_linalg.lu_solve({0}, {1}, {2}, torch.eye({0}.shape[-1], dtype={0}.dtype, device={0}.device))",
        "trace": "{0}.diagonal(dim1=-2, dim2=-1).sum(-1)",
        "sum": "{0}.sum(-1)",
        "scale_by": "{0}[..., None, None] * {1}",
        "scale_by_vector": "{0}[..., None] * {1}",
        "conj": "{0}",
        "real_part": "{0}",
        "imaginary_part": "torch.zeros_like({0})",
        "scalar_mul": "{0} * {1}",
        "zeros_like": "torch.zeros_like({0})",
        "adjugate": "_linalg.adjugate({0})",
        "adjugate_lu": "_linalg.adjugate({0}, {1}, {2}, adjoint={adjoint})",
        "matrix_exp": "_linalg.matrix_exp({0})",
        "expm_frechet": "_linalg.expm_frechet({0}, {1})",
        "expm_frechet_solve": "_linalg.expm_frechet_solve({0}, {1})",
        "triangular_sylvester_solve": "_linalg.triangular_sylvester_solve({0}, {1}, upper={upper})",
    },
    # no in-place statements: a backward may run under vmap with batched cotangents (jacrev,
    # is_grads_batched), where writing a batched value into an unbatched temporary fails
    complex_table={
        "transpose": "{0}.mH",
        "skew": "0.5 * ({0} - {0}.mH)",
        "sym": "0.5 * ({0} + {0}.mH)",
        "pairwise_mul_skew": "{fn}_times({0}, {1} - {1}.mH, 0.5{options})",
        "pairwise_mul_sym": "{fn}_times({0}, {1} + {1}.mH, 0.5{options})",
        "diag_sym": "{0}.diagonal(dim1=-2, dim2=-1).real",
        "diag_skew": "1j * {0}.diagonal(dim1=-2, dim2=-1).resolve_conj().imag",
        "conj": "{0}.conj()",
        "real_part": "{0}.real",
        "imaginary_part": "1j * {0}.resolve_conj().imag",
    },
    imports={
        "_functools": "functools",
        "torch": "torch",
        **{f"_{m}": f"adjointgen.runtime:{m}" for m in _TORCH_RUNTIME},
        "_ScalarProgram": "adjointgen.runtime.divided:ScalarProgram",
        "_resolve": "adjointgen.runtime.host:resolve",
    },
    forward="torch",
    forwards="adjointgen.runtime.forward",
)


BACKEND = Backend("torch", "torch/op.py.j2", PRINTER, "#", runtime=("adjointgen.runtime",), package_init="torch/__init__.py",
                  verifier=verify_torch_module, libraries=("torch",))
