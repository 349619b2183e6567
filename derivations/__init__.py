"""adjointgen's catalogue of derivations, shipped with the package as ``adjointgen.catalogue``.

Each ``<name>.py`` is a derivation script (run by ``adjointgen``, not imported); ``_*.py`` are
helpers they share.  ``adjointgen --catalogue audit NAME`` audits the installed copy;
``adjointgen init DIR --copy NAME`` copies one (and its helpers) into a new project to edit.
"""
