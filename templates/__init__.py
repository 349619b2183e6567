"""The built-in Jinja2 templates of adjointgen (installed as ``adjointgen.templates``).

A project overrides any of them with a file of the same name in its own templates folder
(``[tool.adjointgen] templates = "templates"``).  Templates hold layout only: every formula comes
from the rule IR of an audited derivation.
"""
