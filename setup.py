"""Maps the top-level folders into one import namespace: explainers/ -> kvx.explainers, and so on.

Everything else is in pyproject.toml; this file exists only because pyproject.toml cannot prefix
found packages with a namespace.
"""
from setuptools import find_packages, setup

TOP = ("explainers", "compute", "site")
# "kvx" itself is the repository root's __init__.py: it holds only `kvx.show` (the notebook view).
packages = ["kvx"] + [f"kvx.{p}" for p in find_packages(include=[f"{t}*" for t in TOP])]

setup(
    packages=packages,
    package_dir={"kvx": "."},
    package_data={"kvx.explainers": ["*/page.md", "*/baked.json", "*/*.jsonl"], "kvx.site": ["templates/*"]},
)
