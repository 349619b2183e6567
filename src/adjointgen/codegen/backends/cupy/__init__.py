"""The NumPy/CuPy backend: the rules for any array module passed as ``xp`` (``cupy/op.py.j2``;
runtime: :mod:`adjointgen.runtime.xp`), launching the CUDA backend's kernels on CuPy."""
from __future__ import annotations

from ...printers import ArrayPrinter
from ...verify import verify_array_module
from .. import Backend

#: the helpers the array backends' entries and templates call, each under ``_<name>`` (``_part``:
#: ``matrix_part``), from the backend's runtime module
_ARRAY_HELPERS = ("add_diag", "add_diag_", "array_module", "check_tangent", "cluster_mask", "masked_quotient",
                  "zero_where_negligible", "reciprocal", "quotient", "lu_solve", "adjugate", "matrix_exp", "expm_frechet",
                  "expm_frechet_solve", "triangular_sylvester_solve", "solve_triangular", "solve_triangular_right",
                  "shifted_solve", "sylvester")


def _array_imports(runtime: str, helpers: tuple[str, ...] = (), **more) -> dict:
    return {
        **more,
        **{f"_{h}": f"{runtime}:{h}" for h in _ARRAY_HELPERS + helpers},
        "_part": f"{runtime}:matrix_part",
        "_divided": "adjointgen.runtime:divided",
        "_host": "adjointgen.runtime:host",
        "_ScalarProgram": "adjointgen.runtime.divided:ScalarProgram",
        "_resolve": "adjointgen.runtime.host:resolve",
    }


PRINTER = ArrayPrinter(
    "xp",
    {
        "matmul": "xp.matmul({0}, {1})",
        "transpose": "xp.swapaxes({0}, -1, -2)",
        "add": None,
        "scale": "{coeff} * {0}",
        "add_diag": "_add_diag(xp, {0}, {1})",
        "scale_rows": "{0}[..., :, None] * {1}",
        "scale_cols": "{0} * {1}[..., None, :]",
        "diag_mul": "{0} * {1}",
        "diagonal": "xp.diagonal({0}, axis1=-2, axis2=-1).copy()",
        "diag_matmul": "xp.sum(xp.swapaxes({0}, -1, -2) * {1}, axis=-2)",
        "reciprocal": "1 / {0}",
        "reciprocal_masked": "_reciprocal(xp, {0}, cluster_rtol)",
        "skew": "0.5 * ({0} - xp.swapaxes({0}, -1, -2))",
        "sym": "0.5 * ({0} + xp.swapaxes({0}, -1, -2))",
        "pairwise_mul": "{fn}_mul(xp, {0}, {1}, part='plain'{options})",
        "hadamard": "{0} * {1}",
        "pairwise_mul_skew": "{fn}_mul(xp, {0}, {1}, part='skew'{options})",
        "pairwise_mul_sym": "{fn}_mul(xp, {0}, {1}, part='sym'{options})",
        "shifted_solve": "_shifted_solve(xp, {0}, {1}, {2}, {3}, {4})",
        "sylvester_solve": "_sylvester(xp, {0}, {1}, {2}, hermitian={hermitian})",
        "add_eye": "{0} + {coeff} * xp.eye({0}.shape[-1], dtype={0}.dtype)",
        "lower_half": "xp.tril({0}, -1) + 0.5 * ({0} * xp.eye({0}.shape[-1], dtype={0}.dtype))",
        "strictly_lower": "xp.tril({0}, -1)",
        "solve_unit_lower": "_solve_triangular(xp, {0}, {1}, lower=True, unit=True)",
        "solve_unit_upper": "_solve_triangular(xp, {0}, {1}, lower=False, unit=True)",
        "solve_right_unit_lower": "_solve_triangular_right(xp, {1}, {0}, lower=True, unit=True)",
        "solve_right_unit_upper": "_solve_triangular_right(xp, {1}, {0}, lower=False, unit=True)",
        "inverse_unit_lower": "xp.linalg.inv({0})",
        "inverse_unit_upper": "xp.linalg.inv({0})",
        "solve_lu": "_lu_solve(xp, {0}, {1}, {2}, {3}, adjoint={adjoint})",
        "solve_right_lu": "_lu_solve(xp, {1}, {2}, {3}, {0}, adjoint={adjoint}, left=False)",
        "solve_general": "xp.linalg.solve({0}, {1})",
        "solve_lower": "_solve_triangular(xp, {0}, {1}, lower=True)",
        "solve_upper": "_solve_triangular(xp, {0}, {1}, lower=False)",
        "solve_right_general": "xp.swapaxes(xp.linalg.solve(xp.swapaxes({1}, -1, -2), xp.swapaxes({0}, -1, -2)), -1, -2)",
        "solve_right_lower": "_solve_triangular_right(xp, {1}, {0}, lower=True)",
        "solve_right_upper": "_solve_triangular_right(xp, {1}, {0}, lower=False)",
        "inverse_general": "xp.linalg.inv({0})",
        "inverse_lower": "xp.linalg.inv({0})",
        "inverse_upper": "xp.linalg.inv({0})",
        "inverse_lu": "_lu_solve(xp, {0}, {1}, {2}, xp.eye({0}.shape[-1], dtype={0}.dtype))",
        "trace": "xp.trace({0}, axis1=-2, axis2=-1)",
        "sum": "{0}.sum(-1)",
        "scale_by": "xp.asarray({0})[..., None, None] * {1}",
        "scale_by_vector": "xp.asarray({0})[..., None] * {1}",
        "conj": "{0}",
        "real_part": "{0}",
        "imaginary_part": "0 * {0}",
        "scalar_mul": "{0} * {1}",
        "zeros_like": "xp.zeros_like({0})",
        "adjugate": "_adjugate(xp, {0})",
        "adjugate_lu": "_adjugate(xp, {0}, {1}, {2}, adjoint={adjoint})",
        "matrix_exp": "_matrix_exp({0})",
        "expm_frechet": "_expm_frechet(xp, {0}, {1})",
        "expm_frechet_solve": "_expm_frechet_solve(xp, {0}, {1})",
        "triangular_sylvester_solve": "_triangular_sylvester_solve(xp, {0}, {1}, upper={upper})",
    },
    inplace={
        "add_diag": "_add_diag_(xp, {0}, {1})",
    },
    imports=_array_imports("adjointgen.runtime.xp", ("is_cupy", "launch_pairwise_kernel", "assemble", "check_spectrum",
                                                     "launch_matrix_kernel"), _functools="functools"),
    forwards="adjointgen.runtime.xp",
    complex_table={
        "transpose": "xp.conj(xp.swapaxes({0}, -1, -2))",
        "skew": "0.5 * ({0} - xp.conj(xp.swapaxes({0}, -1, -2)))",
        "sym": "0.5 * ({0} + xp.conj(xp.swapaxes({0}, -1, -2)))",
        "pairwise_mul": "{fn}_mul(xp, {0}, {1}, part='plain', hermitian=True{options})",
        "pairwise_mul_skew": "{fn}_mul(xp, {0}, {1}, part='skew', hermitian=True{options})",
        "pairwise_mul_sym": "{fn}_mul(xp, {0}, {1}, part='sym', hermitian=True{options})",
        "diag_sym": "xp.diagonal({0}, axis1=-2, axis2=-1).real.copy()",
        "diag_skew": "1j * xp.diagonal({0}, axis1=-2, axis2=-1).imag",
        "conj": "xp.conj({0})",
        "real_part": "xp.real({0})",
        "imaginary_part": "1j * xp.imag({0})",
    },
)


BACKEND = Backend("cupy", "cupy/op.py.j2", PRINTER, "#", runtime=("adjointgen.runtime.xp", "adjointgen.runtime.divided",
                                                               "adjointgen.runtime.host"),
                  package_init="cupy/__init__.py", verifier=verify_array_module)
