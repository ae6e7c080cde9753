"""``python -m opscope ...``: the same as the ``opscope`` command."""

from opscope.cli.main import main

if __name__ == "__main__":
    main()
