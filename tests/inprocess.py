"""The command line run in the test's own process: what it prints and its exit status, without
starting Python, SymPy and torch again for every call.  A project's own modules are forgotten
after each run (``Project.importable``), so projects in different folders do not mix."""
import contextlib
import io
import os
import types


def run(*args, cwd):
    from adjointgen import cli

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main([str(a) for a in args])
            except SystemExit as exc:  # argparse's errors
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(here)
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
