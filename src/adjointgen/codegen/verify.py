"""Verify generated code against the audited rules, before anything is written.

The audit checks the derivation; this checks what the templates made of it.  Every emitted torch
and NumPy rule function is run on the audit's own instances and compared with the derived
expression evaluated by the audit's interpreter.  For operations with a declared forward, the
generated autograd function is run as a user runs it: its forward outputs must satisfy the
derivation's identities, its backward must equal the derived VJP and its forward mode the derived
JVP (at the outputs it computed itself, so sign and phase choices of the forward do not matter), and
the public function must return what the autograd function returns.  A template edit that flips a
sign, drops a term or passes arguments in the wrong order fails here, naming the generated file and
the function.
"""
from __future__ import annotations

import types
from pathlib import Path

import numpy as np

from .ir import OPTIONAL_ROLES, PAIRWISE_ROLE

#: relative error allowed between a generated function and the derived expression (float64)
TOLERANCE = 1e-8


class VerificationFailed(Exception):
    pass


def _module(path: Path, text: str, name: str):
    mod = types.ModuleType(name)
    mod.__file__ = str(path)
    exec(compile(text, str(path), "exec"), mod.__dict__)
    return mod


def _relative_error(got, want) -> float:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    scale = max(float(np.linalg.norm(want)), 1e-300)
    return float(np.linalg.norm(got - want)) / scale if np.linalg.norm(want) > 0 else float(np.linalg.norm(got))


def _is_complex(ctx) -> bool:
    return any(np.iscomplexobj(v) for v in ctx.env.values() if isinstance(v, np.ndarray))


def _value(env, param, d=None, dims=None):
    if param.role in OPTIONAL_ROLES:
        return None  # a saved factorization, a cluster mask, an option: the rules' defaults
    if param.role == PAIRWISE_ROLE:  # a function's pairwise matrix: the instance's own
        from ..calculus.evaluate import evaluate

        return evaluate(d.pairwise_matrix(param.symbol), env, dims)
    x = env[param.symbol]
    if param.kind == "scalar":
        return np.asarray(x).reshape(())
    return np.diagonal(x).copy() if param.kind == "diag" else x


def verify_generated(project, d, op, texts: dict) -> None:
    """Raise :class:`VerificationFailed` unless every generated function reproduces its rule.
    ``texts``: backend name -> (path, text) of the files rendered; each backend's ``verifier``
    (:class:`~adjointgen.codegen.backends.Backend`) says how its module is run."""
    from ..audit.runner import instances
    from .generate import BACKENDS

    contexts = instances(d)
    problems: list[str] = []
    with project.importable():
        for backend in BACKENDS:
            if backend.verifier is not None and backend.name in texts:
                path, text = texts[backend.name]
                backend.verifier(op, d, path, text, contexts, problems)
    if problems:
        raise VerificationFailed(
            f"the generated code of '{op.name}' does not reproduce the audited derivation "
            f"({d.path}); nothing was written:\n  " + "\n  ".join(problems[:12]))


def verify_array_module(op, d, path, text, contexts, problems):
    """A NumPy/CuPy module: its rule functions on NumPy arrays."""
    module = _load(path, text, f"_adjointgen_verify_{op.name}_{Path(path).parent.name}", problems)
    if module is not None:
        _check_rules(op, d, module, contexts, path, problems, to_array=lambda x: x, to_numpy=np.asarray)


def verify_torch_module(op, d, path, text, contexts, problems):
    """A torch module: its rules (both paths), its autograd and public functions, its concrete
    matrix functions."""
    try:
        import torch
    except ImportError:  # the torch code cannot be run here; its text is still compared
        return
    module = _load(path, text, f"_adjointgen_verify_{op.name}_{Path(path).parent.name}", problems)
    if module is not None:
        _check_rules(op, d, module, contexts, path, problems, to_array=torch.from_numpy,
                     to_numpy=lambda t: t.detach().resolve_conj().numpy(), both_paths=True)
        if op.public is not None and op.public.torch_forward is not None:
            _check_function(op, d, module, contexts, path, problems, torch)
        if op.instances:
            _check_instances(op, d, module, contexts, path, problems, torch)


def verify_jax_module(op, d, path, text, contexts, problems):
    """A JAX module: its rules on ``jax.numpy`` arrays, and its public ``jax.custom_jvp`` function
    under ``jax.vjp`` and ``jax.jvp`` (float64 throughout)."""
    try:
        import jax
    except ImportError:  # the JAX code cannot be run here; its text is still compared
        return
    _jax_compilation_cache(jax)
    with jax.enable_x64(True):
        module = _load(path, text, f"_adjointgen_verify_{op.name}_{Path(path).parent.name}", problems)
        if module is None:
            return
        _check_rules(op, d, module, contexts, path, problems, to_array=jax.numpy.asarray, to_numpy=np.asarray)
        if op.public is not None and op.public.numpy_forward is not None:
            _check_jax_function(op, d, module, contexts, path, problems, jax)


def _jax_compilation_cache(jax) -> None:
    """JAX compiles every operation it runs eagerly, per shape and dtype: seconds per operation and
    process.  Unless the process has a compilation cache of its own, keep those compilations in
    ``$XDG_CACHE_HOME/adjointgen/jax`` (``~/.cache/adjointgen/jax``; ``ADJOINTGEN_JAX_CACHE=0``
    turns this off), so that a later ``adjointgen generate`` reuses them."""
    import os

    if os.environ.get("ADJOINTGEN_JAX_CACHE", "1") == "0" or jax.config.jax_compilation_cache_dir:
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    jax.config.update("jax_compilation_cache_dir", os.path.join(base, "adjointgen", "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _check_jax_function(op, d, module, contexts, path, problems, jax):
    """The public function as a JAX user runs it: forward outputs satisfying the identities, and
    ``jax.vjp`` (JAX's transposition of the derived JVP) and ``jax.jvp`` equal to the derived rules."""
    from ..audit.checks import forward_outputs, identity_residual
    from ..calculus.evaluate import evaluate
    from ..runtime import gauge

    public = getattr(module, op.name, None)
    if public is None:
        problems.append(f"{path}: the public function {op.name} is missing")
        return
    pub = op.public
    by_code = {d.api_names.get(s.name, s.name): s for s in d.inputs + d.outputs}
    jnp = jax.numpy

    def call(*xs):
        out = public(*xs)
        return out if isinstance(out, tuple) else (out,)

    import ast

    options = tuple(ast.literal_eval(v) for _, v in pub.all_options)
    if len(pub.returned) < len(pub.kept):
        # hidden outputs have rules too: check them all on the function the public one returns a part of
        custom = getattr(module, f"_{op.name}_custom_jvp")

        def call(*xs):  # noqa: F811
            return tuple(custom(*xs, *options))

    seen = set()  # one real and one complex instance: the rule functions ran on all of them
    for index, ctx in enumerate(contexts):
        complex_instance = _is_complex(ctx)
        if (complex_instance and not pub.complex) or complex_instance in seen:
            continue
        seen.add(complex_instance)
        inputs = [jnp.asarray(ctx.env[s.name]) for s in d.inputs]
        try:
            with gauge.disabled():
                out, pullback = jax.vjp(call, *inputs)
                full = out if not pub.auxiliary else module._forward_outputs(*inputs, *options[:len(pub.options)])
                values = forward_outputs(d, tuple(np.asarray(o) for o in full), np)
                residual = identity_residual(d, ctx, values)
                if not residual <= 1e-7:
                    problems.append(f"{path}: the forward of {op.name} does not satisfy the identities (relative "
                                    f"residual {residual:.2e}, instance {index}): check its outputs' order and conventions")
                    continue
                env = dict(ctx.env)
                env.update(values)
                # JAX transposes without conjugating: its cotangents are the conjugates of the
                # derivation's (Re <G, dX> = Re tr(G^H dX))
                cotangents = tuple(jnp.zeros_like(value) if o.constant else
                                   jnp.conj(jnp.asarray(_public_form(ctx.cotangents["g" + by_code[o.name].name], o.form)))
                                   for o, value in zip(pub.kept, out))
                got = [jnp.conj(g) for g in pullback(cotangents)]
                vjp = d.vjp if complex_instance or d.real_vjp is None else d.real_vjp
                for s, g in zip(d.inputs, got):
                    err = _relative_error(np.asarray(g), evaluate(vjp.raw["g" + s.name], env, ctx.dims))
                    if not err <= TOLERANCE:
                        problems.append(f"{path}: jax.vjp of {op.name}: g{s.name} differs from the derived VJP by "
                                        f"{err:.2e} (relative) on audit instance {index}")
                tangents = tuple(jnp.asarray(ctx.env["d" + s.name]) for s in d.inputs)
                _, dout = jax.jvp(call, tuple(inputs), tangents)
                jvp = d.jvp if complex_instance or d.real_jvp is None else d.real_jvp
                for o, t in zip(pub.kept, dout):
                    if o.constant:
                        continue
                    want = _public_form(evaluate(jvp.raw["d" + by_code[o.name].name], env, ctx.dims), o.form)
                    err = _relative_error(np.asarray(t), want)
                    if not err <= TOLERANCE:
                        problems.append(f"{path}: jax.jvp of {op.name}: d{o.public} differs from the derived JVP by "
                                        f"{err:.2e} (relative) on audit instance {index}")
        except Exception as exc:
            problems.append(f"{path}: {op.name} raised {type(exc).__name__}: {exc} (instance {index})")


#: Backend.verifier -> how its generated module is run
def _load(path, text, name, problems):
    try:
        return _module(path, text, name)
    except Exception as exc:
        problems.append(f"{path}: the generated module does not load: {type(exc).__name__}: {exc}")
        return None


def _rule_sets(op):
    """(rule, applies to complex instances?) for every generated rule."""
    for rule in op.rules:
        yield rule, rule.complex


def _check_rules(op, d, module, contexts, path, problems, *, to_array, to_numpy, both_paths=False):
    """Every rule function on every instance; the torch ones twice where they have products with
    reciprocal gaps: once as the instances' separated values let them run (one division by the gap
    matrix) and once forming the masked matrices, the path clusters take."""
    from ..runtime import degeneracy

    _check_rules_once(op, d, module, contexts, path, problems, to_array=to_array, to_numpy=to_numpy)
    if both_paths and any(fn.fused for fn in op.pairwise):
        with degeneracy.formed_products():
            _check_rules_once(op, d, module, contexts, path, problems, to_array=to_array, to_numpy=to_numpy,
                              note=" (with the masked matrices formed)")


def _check_rules_once(op, d, module, contexts, path, problems, *, to_array, to_numpy, note=""):
    from ..calculus.evaluate import evaluate

    for rule, complex_rule in _rule_sets(op):
        fn = getattr(module, rule.name, None)
        if fn is None:
            problems.append(f"{path}: no function {rule.name}")
            continue
        exprs = dict(rule.expressions)
        for index, ctx in enumerate(contexts):
            if _is_complex(ctx) != complex_rule and (d.field == "complex"):
                continue
            if any(np.shape(ctx.env[n])[0] != np.shape(ctx.env[n])[1] for n in rule.square):
                continue  # a rule specialised to square shapes, at an instance that has none
            env = dict(ctx.env)
            if complex_rule:  # a complex rule takes real data as complex (a complex-only operation's)
                env = {k: v.astype(np.result_type(v.dtype, np.complex64)) if isinstance(v, np.ndarray) else v
                       for k, v in env.items()}
            try:
                got = fn(*[None if p.role in OPTIONAL_ROLES else to_array(_value(env, p, d, ctx.dims))
                           for p in rule.params])
            except Exception as exc:
                problems.append(f"{path}: {rule.name} raised {type(exc).__name__}: {exc} (instance {index}){note}")
                break
            got = got if isinstance(got, tuple) else (got,)
            for (out_name, _value_name, kind), value in zip(rule.outputs, got):
                want = evaluate(exprs[out_name], env, ctx.dims)
                if kind == "diag":
                    want = np.diagonal(want)
                elif kind == "scalar":
                    want = np.asarray(want).reshape(())
                err = _relative_error(to_numpy(value), want)
                if not err <= TOLERANCE:
                    problems.append(f"{path}: {rule.name} output {out_name} differs from the derived "
                                    f"expression by {err:.2e} (relative) on audit instance {index}{note}")


def _check_function(op, d, module, contexts, path, problems, torch):
    """The autograd function and the public function, run as a user runs them."""
    from ..audit.checks import forward_outputs, identity_residual
    from ..calculus.evaluate import evaluate
    from ..runtime import gauge

    cls = getattr(module, "".join(part.capitalize() for part in op.name.split("_")) + "Function", None)
    public = getattr(module, op.name, None)
    if cls is None or public is None:
        problems.append(f"{path}: the autograd function or the public function {op.name} is missing")
        return
    pub = op.public
    options = tuple(eval(default) for _, default in pub.all_options)  # noqa: S307 - repr of a literal
    by_code = {d.api_names.get(s.name, s.name): s for s in d.inputs + d.outputs}
    for index, ctx in enumerate(contexts):
        complex_instance = _is_complex(ctx)
        if complex_instance and not pub.complex:
            continue
        inputs = [torch.from_numpy(ctx.env[s.name]).requires_grad_() for s in d.inputs]
        from ..runtime.checks import Options

        call = (lambda *xs: cls.apply(*xs, Options(options))) if options else cls.apply
        try:
            with gauge.disabled():
                out = call(*inputs)
                out = (out if isinstance(out, tuple) else (out,))[:len(pub.outputs)]  # without saved factors
                values = forward_outputs(d, tuple(o.detach().resolve_conj().numpy() for o in out), np)
                residual = identity_residual(d, ctx, values)
                if not residual <= 1e-7:
                    problems.append(f"{path}: the forward {pub.torch_forward.module}:{pub.torch_forward.attr} "
                                    f"does not satisfy the identities (relative residual {residual:.2e}, instance "
                                    f"{index}): check the order and conventions of its outputs")
                    continue
                env = dict(ctx.env)
                env.update(values)
                # reverse mode: the cotangents of the audit, in the outputs' public forms
                grads, ruled = [], []
                for o, value in zip(pub.outputs, out):
                    if not o.has_rule:
                        if value.requires_grad:
                            problems.append(f"{path}: {cls.__name__}: the {'constant' if o.constant else 'auxiliary'} "
                                            f"output {o.public} is differentiable")
                        continue
                    g = ctx.cotangents["g" + by_code[o.name].name]
                    g = _public_form(g, o.form)
                    grads.append(torch.from_numpy(np.array(g, order="C")))
                    ruled.append(value)
                got = torch.autograd.grad(ruled, inputs, grads, allow_unused=True)
                vjp = d.vjp if complex_instance or d.real_vjp is None else d.real_vjp
                for s, g in zip(d.inputs, got):
                    want = evaluate(vjp.raw["g" + s.name], env, ctx.dims)
                    err = _relative_error(np.zeros_like(want) if g is None else g.resolve_conj().numpy(), want)
                    if not err <= TOLERANCE:
                        problems.append(f"{path}: {cls.__name__}.backward: g{s.name} differs from the derived VJP "
                                        f"by {err:.2e} (relative) on audit instance {index}")
                # forward mode
                tangents = tuple(torch.from_numpy(ctx.env["d" + s.name]) for s in d.inputs)
                primals = tuple(x.detach() for x in inputs)
                _, dout = torch.func.jvp(lambda *xs: tuple(call(*xs))[:len(pub.outputs)] if pub.saved_factors
                                         else call(*xs), primals, tangents)
                dout = dout if isinstance(dout, tuple) else (dout,)
                jvp = d.jvp if complex_instance or d.real_jvp is None else d.real_jvp
                for o, t in zip(pub.outputs, dout):
                    sym = by_code[o.name]
                    if not o.has_rule:
                        if t is not None and bool(t.ne(0).any()):
                            problems.append(f"{path}: {cls.__name__}.jvp: the {'constant' if o.constant else 'auxiliary'} "
                                            f"output {o.public} has a tangent")
                        continue
                    want = _public_form(evaluate(jvp.raw["d" + sym.name], env, ctx.dims), o.form)
                    err = _relative_error(t.resolve_conj().numpy(), want)
                    if not err <= TOLERANCE:
                        problems.append(f"{path}: {cls.__name__}.jvp: d{o.public} differs from the derived JVP "
                                        f"by {err:.2e} (relative) on audit instance {index}")
                # the public function returns what the autograd function returns
                pub_out = public(*[x.detach() for x in inputs])
                pub_out = pub_out if isinstance(pub_out, tuple) else (pub_out,)
                for o, a, b in zip(pub.returned, pub_out, [v for o, v in zip(pub.outputs, out) if o in pub.returned]):
                    if not torch.equal(a.detach().resolve_conj(), b.detach().resolve_conj()):
                        problems.append(f"{path}: the public function {op.name} returns another {o.public} than "
                                        f"{cls.__name__} (instance {index})")
        except Exception as exc:
            problems.append(f"{path}: {cls.__name__} raised {type(exc).__name__}: {exc} (instance {index})")


def _public_form(x, form):
    """A matrix value of the audit in the form the public function uses for it."""
    if form == "vector":
        return np.diagonal(x).copy()
    if form == "adjoint":
        return x.conj().T
    if form == "scalar":
        return np.asarray(x).reshape(())
    return x


#: option values the instances with options are verified at (``p`` of ``x**p``)
INSTANCE_OPTIONS = (1.5,)


def _check_instances(op, d, module, contexts, path, problems, torch):
    """Each concrete function of a derivation generic in ``f``: its public function's value, backward
    and forward mode against the derived rule with that ``f`` substituted, and its generated
    ``L`` and ``f[a, b, c]`` against the derivation's definitions, on the audit's matrices."""
    import sympy as sp

    from ..audit.checks import second_divided
    from ..calculus.evaluate import evaluate

    for inst in op.instances:
        opts = INSTANCE_OPTIONS[:len(inst.options)]
        expr = inst.expr.xreplace({sym: sp.nsimplify(v) for (_, sym), v in zip(inst.options, opts)})
        concrete = sp.Lambda(inst.variable, expr)
        public = getattr(module, inst.name, None)
        L_fn, dd2 = getattr(module, f"{inst.name}_L", None), getattr(module, f"{inst.name}_dd2", None)
        if public is None or L_fn is None:
            problems.append(f"{path}: the functions of {inst.name} are missing")
            continue
        f_num = sp.lambdify(inst.variable, expr, "numpy")
        for index, ctx in enumerate(contexts):
            env = dict(ctx.env)
            env["__functions__"] = {inst.function: concrete}
            X = d.rule_outputs[0].name
            U = next(o.name for o in d.outputs if o.name in d.structure.orthonormal)
            Dn = next(o.name for o in d.outputs if o.name in d.structure.diagonal)
            A = env[d.inputs[0].name]
            Uv, w = env[U], np.diagonal(env[Dn]).real.copy()
            want_X = (Uv * f_num(w)) @ Uv.conj().T
            try:
                At = torch.from_numpy(A).requires_grad_()
                out = public(At, *opts)
                err = _relative_error(out.detach().resolve_conj().numpy(), want_X)
                if not err <= TOLERANCE:
                    problems.append(f"{path}: {inst.name} differs from V f(w) V^H by {err:.2e} (instance {index})")
                g = ctx.cotangents["g" + X]
                (gA,) = torch.autograd.grad(out, At, torch.from_numpy(g))
                want = evaluate(d.vjp.raw["g" + d.inputs[0].name], env, ctx.dims)
                err = _relative_error(gA.resolve_conj().numpy(), want)
                if not err <= TOLERANCE:
                    problems.append(f"{path}: {inst.name}: the backward differs from the derived VJP by {err:.2e} "
                                    f"(instance {index})")
                dA = env["d" + d.inputs[0].name]
                _, tangent = torch.func.jvp(lambda a: public(a, *opts), (At.detach(),), (torch.from_numpy(dA),))
                want = evaluate(d.jvp.raw["d" + X], env, ctx.dims)
                err = _relative_error(tangent.resolve_conj().numpy(), want)
                if not err <= TOLERANCE:
                    problems.append(f"{path}: {inst.name}: forward mode differs from the derived JVP by {err:.2e} "
                                    f"(instance {index})")
                want_L = evaluate(d.pairwise_matrix(op.pairwise_params[0][0]), env, ctx.dims)
                err = _relative_error(L_fn(torch.from_numpy(w), *opts).numpy(), want_L)
                if not err <= TOLERANCE:
                    problems.append(f"{path}: {inst.name}_L differs from the derivation's L by {err:.2e} (instance {index})")
                if d.second is not None and dd2 is not None:
                    second = second_divided(env, d.pairwise[d.second.L])
                    t = torch.from_numpy(w)
                    got = dd2(t[:, None, None], t[None, :, None], t[None, None, :], *opts).numpy()
                    want = np.array([[[second(a, b, c) for c in w] for b in w] for a in w])
                    err = _relative_error(got, want)
                    if not err <= TOLERANCE:
                        problems.append(f"{path}: {inst.name}_dd2 differs from the second divided differences by "
                                        f"{err:.2e} (instance {index})")
            except Exception as exc:
                problems.append(f"{path}: {inst.name} raised {type(exc).__name__}: {exc} (instance {index})")
