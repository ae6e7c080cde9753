"""The ``opscope`` command line (``opscope ...`` or ``python -m opscope ...``).

Verbs, one module each: ``run`` profiles a script, ``demo`` profiles a
built-in model. See ``opscope --help``.
"""
