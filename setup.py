"""The one build step pyproject.toml cannot declare: the on-demand start-up hook's .pth file.

``opscope-on-demand.pth`` goes at the root of the wheel, that is into
site-packages, for ``pip install .`` and ``pip install -e .`` alike. It is in
the wheel's RECORD, so ``pip uninstall opscope`` removes it. Its one line is
``_opscope_startup.PTH_LINE``; everything else is in pyproject.toml.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# this checkout's module, not an installed one
from _opscope_startup import PTH_LINE, PTH_NAME  # noqa: E402


class build_py_with_startup_hook(build_py):
    """build_py, plus the .pth file at the root of what goes into the wheel."""

    def run(self):
        super().run()
        path = self._pth_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(PTH_LINE + "\n")

    def get_outputs(self, include_bytecode=True):
        return list(super().get_outputs(include_bytecode)) + [self._pth_path()]

    def _pth_path(self):
        # An editable wheel is built from the folder that setuptools names install_lib;
        # build_lib is then a throw-away folder (setuptools' editable_wheel).
        if getattr(self, "editable_mode", False):
            return os.path.join(self.get_finalized_command("install").install_lib, PTH_NAME)
        return os.path.join(self.build_lib, PTH_NAME)


setup(cmdclass={"build_py": build_py_with_startup_hook})
