"""The native observer's headers (collect/native/observer/*.h): in its build key, its build and
its package data.

observer.cpp is one translation unit that includes a header per job; a cached build is
found by its key alone, so an edit to any header must change the key, or a stale
observer would be loaded from the cache.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import sys
from pathlib import Path

import pytest

from opscope.collect.native import build_cache, build as native_build
from opscope.collect.native.build import NativeExtension

ROOT = Path(__file__).resolve().parents[1]
COLLECT = ROOT / "opscope" / "collect" / "native"
HEADERS = COLLECT / "observer"


def copied_observer(folder: Path) -> NativeExtension:
    """The observer's sources copied into folder, as an extension built from there."""
    folder.mkdir(parents=True)
    shutil.copy(COLLECT / "observer.cpp", folder / "observer.cpp")
    shutil.copytree(HEADERS, folder / "observer")
    return NativeExtension(folder / "observer.cpp", "opscope_observer", "native collector",
                           "using the Python fallback collector",
                           extra=lambda: build_cache.headers_options(folder / "observer"))


def test_the_observers_key_covers_its_headers():
    options = native_build.OBSERVER.extra_options()
    assert options["include_dirs"] == [str(HEADERS)]
    assert options["key"] == build_cache.headers_options(HEADERS)["key"]
    assert native_build.build_key() == native_build.source_build_key(
        native_build.SOURCE, options["key"])
    assert native_build.build_key() != native_build.source_build_key(native_build.SOURCE)


def test_editing_adding_or_renaming_a_header_changes_the_key(tmp_path):
    ext = copied_observer(tmp_path / "src")
    headers = tmp_path / "src" / "observer"
    first = ext.build_key()
    assert copied_observer(tmp_path / "elsewhere").build_key() == first  # no path in it
    records = headers / "records.h"
    text = records.read_text()
    records.write_text(text.replace("constexpr int kMaxStackDepth = 128;",
                                    "constexpr int kMaxStackDepth = 64;"))
    edited = ext.build_key()
    assert edited != first
    records.write_text(text)
    assert ext.build_key() == first
    (headers / "extra.h").write_text("#pragma once\n")
    assert ext.build_key() not in (first, edited)
    (headers / "extra.h").unlink()
    records.rename(headers / "records2.h")
    assert ext.build_key() != first
    assert ext.library_path().parent.name == ext.build_key()


def included(path: Path) -> list:
    return re.findall(r'^#include "(?:observer/)?([^"]+)"', path.read_text(), re.M)


def test_every_header_is_included_once_and_guarded():
    names = included(COLLECT / "observer.cpp")
    for header in sorted(HEADERS.glob("*.h")):
        names += included(header)
        text = header.read_text()
        assert "#pragma once" in text, header.name
        assert text.startswith("// opscope native observer: "), header.name  # says its job
    assert sorted(names) == sorted(h.name for h in HEADERS.glob("*.h"))
    versions = sorted(h.name for h in HEADERS.glob("frames_cpython3*.h"))
    assert versions == [f"frames_cpython3{minor}.h" for minor in (10, 11, 12, 13)]


def test_every_cpp_source_is_package_data():
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is 3.11+")
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["opscope"]
    package = ROOT / "opscope"
    sources = sorted(p.relative_to(package).as_posix() for suffix in ("*.cpp", "*.h")
                     for p in package.rglob(suffix))
    assert "collect/native/observer/records.h" in sources
    # every C++ source of the package goes into an installed (not editable) opscope
    missing = [s for s in sources if not any(fnmatch.fnmatch(s, p) for p in patterns)]
    assert not missing, f"C++ sources not in pyproject.toml's package-data: {missing}"


def test_an_error_in_a_header_names_the_header():
    log = ("[1/2] c++ -c /a/b/observer.cpp -o observer.o\nFAILED: observer.o\n"
           "In file included from /a/b/observer.cpp:80:\n"
           "/a/b/observer/records.h:12:3: error: 'foo' was not declared\n")
    assert native_build.first_error(log) == "records.h:12: error: 'foo' was not declared"
