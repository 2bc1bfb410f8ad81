"""Maps the top-level folders into one import namespace: explainers/ -> kvx.explainers, and so on.

Everything else is in pyproject.toml; this file exists only because pyproject.toml cannot prefix
found packages with a namespace.
"""
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

TOP = ("explainers", "compute", "site")
# "kvx" itself is the repository root's __init__.py: it holds only `kvx.show` (the notebook view).
packages = ["kvx"] + [f"kvx.{p}" for p in find_packages(include=[f"{t}*" for t in TOP])]


class BuildPy(build_py):
    """The "kvx" package is the repository root, which also holds this script: keep it out of the wheel."""
    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir) if (m[0], m[1]) != ("kvx", "setup")]


setup(
    cmdclass={"build_py": BuildPy},
    packages=packages,
    package_dir={"kvx": "."},
    package_data={"kvx.explainers": ["*/page.md", "*/baked.json", "*/*.jsonl"], "kvx.site": ["templates/*"]},
)
